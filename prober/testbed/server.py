"""HTTP front of the reference engine: OpenAI-compatible routes, SGLang-style introspection, metrics.

`TestbedServer` runs it in a background thread on a loopback port (port 0 = ephemeral), which is how
tests and `leakprobe demo` get a real HTTP target without a second process.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
import uvicorn
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from prober import __version__
from prober.system.malloc import cap_arenas
from prober.testbed.answering import Answering
from prober.testbed.backend import ModelState
from prober.testbed.config import EngineConfig
from prober.testbed.engine import ReferenceEngine
from prober.testbed.formats import Chat, Completions, Responses
from prober.testbed.media import MediaRefused
from prober.testbed.paging import EngineError
from prober.testbed.protocol import ChatRequest, CompletionRequest, ResponsesRequest, TokenizeRequest, error_body

M = TypeVar("M", bound=BaseModel)
CHAT, COMPLETIONS, RESPONSES = Chat(), Completions(), Responses()


class HTTPProblem(Exception):
    def __init__(self, status: int, message: str, err_type: str) -> None:
        super().__init__(message)
        self.status, self.message, self.err_type = status, message, err_type

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.status, self.message, self.err_type), status_code=self.status)


# What the engine counts about itself: stat -> (help, whether a counter), and each real engine's name for it
# (with any label it adds).
COUNTED = {
    "aborted": ("Requests aborted by the scheduler.", True),
    "transfer_failed": ("Prefill-to-decode KV transfers that failed.", True),
    "prompt_tokens": ("Prompt tokens received.", True),
    "cached_tokens": ("Prompt tokens served from the prefix cache.", True),
    "external_queries": ("Prompt tokens the second tier was asked for (a KV connector's lookups).", True),
    "external_hits": ("Prompt tokens served from the second tier.", True),
    "running": ("Requests running.", False),
    "kv_usage": ("Share of the KV pool in use.", False),
}
ENGINE_NAMES: dict[str, dict[str, tuple[str, dict[str, str]]]] = {
    "sglang": {"aborted": ("sglang:num_aborted_requests", {}),
               "transfer_failed": ("sglang:num_transfer_failed_reqs", {}),
               "prompt_tokens": ("sglang:prompt_tokens", {}), "cached_tokens": ("sglang:cached_tokens", {}),
               "running": ("sglang:num_running_reqs", {}), "kv_usage": ("sglang:token_usage", {})},
    "vllm": {"aborted": ("vllm:request_success", {"finished_reason": "abort"}),
             "transfer_failed": ("vllm:nixl_num_failed_transfers", {}),
             "prompt_tokens": ("vllm:prompt_tokens", {}), "cached_tokens": ("vllm:prefix_cache_hits", {}),
             "running": ("vllm:num_requests_running", {}), "kv_usage": ("vllm:kv_cache_usage_perc", {}),
             "external_queries": ("vllm:external_prefix_cache_queries", {}),
             "external_hits": ("vllm:external_prefix_cache_hits", {})},
}


class _PoolCollector(Collector):
    """The engine's own pools, plus what it counts about itself under a real engine's names (`metrics:`):
    SGLang's `--enable-metrics` or vLLM's (aborts, failed transfers, KV usage, running requests, prompt and
    cached tokens), so a prober's engine telemetry reads them as it would read that engine."""

    def __init__(self, engine: ReferenceEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield from self._counted()
        yield from self._pools()
        # As client_python's process collector exports it: two engines behind one balanced /metrics differ here.
        started = GaugeMetricFamily("process_start_time_seconds", "Start time of the process since unix epoch in "
                                    "seconds (the engine's: several may share one test process).")
        started.add_metric([], self.engine.started_at)
        yield started

    def _counted(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats, usage = self.engine.stats, self.engine.paging.prefill_pool.usage()
        values = {"aborted": stats.aborted, "transfer_failed": stats.transfer_failed,
                  "prompt_tokens": stats.prompt_tokens, "cached_tokens": stats.cached_tokens,
                  "running": stats.running, "kv_usage": usage.tokens_used / usage.tokens_total,
                  "external_queries": stats.external_queries, "external_hits": stats.external_hits}
        for stat, (name, labels) in ENGINE_NAMES[self.engine.config.metrics].items():
            what, counter = COUNTED[stat]
            family = (CounterMetricFamily if counter else GaugeMetricFamily)(name, what,
                                                                            labels=["model_name", *labels])
            family.add_metric([self.engine.config.model_name, *labels.values()], values[stat])
            yield family

    def _pools(self) -> Iterator[GaugeMetricFamily]:
        total = GaugeMetricFamily("leakprobe_testbed_kv_pool_tokens", "KV pool capacity in tokens",
                                  labels=["pool"])
        used = GaugeMetricFamily("leakprobe_testbed_kv_pool_used_tokens", "KV tokens held by requests",
                                 labels=["pool"])
        for pool in (self.engine.paging.prefill_pool, self.engine.paging.decode_pool):
            if pool is not None:
                usage = pool.usage()
                total.add_metric([pool.name], usage.tokens_total)
                used.add_metric([pool.name], usage.tokens_used)
        yield total
        yield used


async def read_json(request: Request, cap: int) -> Any:
    """The request body as JSON, refused past `cap` bytes before it is all read."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise HTTPProblem(413, f"request body exceeds {cap} bytes", "RequestTooLarge")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise HTTPProblem(413, f"request body exceeds {cap} bytes", "RequestTooLarge")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks).decode("utf-8"))
    except UnicodeDecodeError:
        raise HTTPProblem(400, "request body is not valid UTF-8", "BadRequestError") from None
    except json.JSONDecodeError as exc:
        raise HTTPProblem(400, f"malformed JSON: {exc}", "BadRequestError") from None
    except RecursionError:
        raise HTTPProblem(400, "malformed JSON: nested too deeply", "BadRequestError") from None


def parse(model: type[M], data: Any) -> M:
    """A request body as its model, or a 400 naming the first field that is wrong."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise HTTPProblem(400, f"invalid request: {where}: {first['msg']}", "BadRequestError") from None


class TestbedApp:
    """Routes bound to one engine and one metrics registry."""

    def __init__(self, engine: ReferenceEngine) -> None:
        self.engine = engine
        self.config: EngineConfig = engine.config
        self.answering = Answering(engine)
        self._tenant_by_key = {key: name for name, key in self.config.tenants.items()}
        self.registry = CollectorRegistry()
        self.registry.register(_PoolCollector(engine))
        self._requests = Counter("leakprobe_testbed_requests", "HTTP requests by route and status",
                                 ["route", "code"], registry=self.registry)
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/server_info", self.server_info, methods=["GET"]),
            Route("/get_server_info", self.server_info, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/tokenize", self.tokenize, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
        ]
        self.app = Starlette(routes=routes)

    # -- plumbing -------------------------------------------------------------------------------
    def _tenant(self, request: Request) -> str:
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        tenant = self._tenant_by_key.get(key.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise HTTPProblem(401, "invalid or missing API key", "AuthenticationError")
        return tenant

    async def _guarded(self, route: str, request: Request,
                       handler: Callable[[Request], Any]) -> Response:
        try:
            response: Response = await handler(request)
        except HTTPProblem as problem:
            response = problem.response()
        except EngineError as exc:
            response = HTTPProblem(exc.status, exc.message, exc.err_type).response()
        except MediaRefused as exc:
            response = HTTPProblem(400, str(exc), "BadRequestError").response()
        self._requests.labels(route, str(response.status_code)).inc()
        return response

    # -- introspection --------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        """200 once the model can answer; 503 while a real model loads (or after it failed to)."""
        backend = self.engine.backend
        state = backend.state
        if state is ModelState.READY:
            return JSONResponse({"status": "ok"})
        body = {"status": state.value, "model": backend.name, **({"error": backend.error} if backend.error else {})}
        return JSONResponse(body, status_code=503)

    async def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type="text/plain; version=0.0.4")

    async def server_info(self, request: Request) -> Response:
        async def handle(request: Request) -> Response:
            self._tenant(request)
            cfg = self.config
            return JSONResponse({
                "model_path": cfg.model_name,
                "context_length": cfg.context_length,
                "max_total_num_tokens": cfg.pool_tokens,
                "max_req_input_len": cfg.max_req_input_len,
                "page_size": cfg.page_size,
                "disaggregation_mode": "prefill" if cfg.mode == "disaggregated" else "null",
                "disable_radix_cache": cfg.prefix_cache_entries == 0,
                "enable_hierarchical_cache": bool(cfg.storage_tier_entries) or cfg.faults.storage_tier_ignores_salt,
                "internal_states": [{"memory_usage": {"token_capacity": cfg.pool_tokens}}],
                "version": cfg.reports_version or f"leakprobe-testbed {__version__}",
            })
        return await self._guarded("server_info", request, handle)

    async def models(self, request: Request) -> Response:
        async def handle(request: Request) -> Response:
            self._tenant(request)
            card = {"id": self.config.model_name, "object": "model", "created": 0,
                    "owned_by": "leakprobe-testbed", "max_model_len": self.config.context_length}
            adapters = [{"id": name, "object": "model", "created": 0, "owned_by": "leakprobe-testbed",
                         "parent": self.config.model_name} for name in self.config.adapters]  # as vLLM lists LoRAs
            return JSONResponse({"object": "list", "data": [card, *adapters]})
        return await self._guarded("models", request, handle)

    async def tokenize(self, request: Request) -> Response:
        async def handle(request: Request) -> Response:
            self._tenant(request)
            body = parse(TokenizeRequest, await read_json(request, self.config.max_body_bytes))
            vocab = self.engine.vocab
            if body.messages is not None:
                messages, add_prompt = body.messages, body.add_generation_prompt
                ids = await anyio.to_thread.run_sync(lambda: vocab.encode_chat(messages, add_prompt))
            elif body.prompt is not None:
                ids = await anyio.to_thread.run_sync(vocab.encode, body.prompt)
            else:
                raise HTTPProblem(400, "invalid request: give `prompt` or `messages`", "BadRequestError")
            return JSONResponse({"tokens": ids.tolist(), "count": int(ids.size),
                                 "max_model_len": self.config.context_length})
        return await self._guarded("tokenize", request, handle)

    # -- generation -----------------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        async def handle(request: Request) -> Response:
            tenant = self._tenant(request)
            body = parse(ChatRequest, await read_json(request, self.config.max_body_bytes))
            vocab = self.engine.vocab
            messages = await anyio.to_thread.run_sync(self.engine.media.see, tenant, body.messages)
            last_user = next((m.text for m in reversed(messages) if m.role == "user"), "")
            ids = await anyio.to_thread.run_sync(lambda: vocab.encode_chat(messages))
            return await self.answering.respond(request, CHAT, tenant, body, ids,
                                                body.requested_max_tokens, last_user)
        return await self._guarded("chat", request, handle)

    async def completions(self, request: Request) -> Response:
        async def handle(request: Request) -> Response:
            tenant = self._tenant(request)
            body = parse(CompletionRequest, await read_json(request, self.config.max_body_bytes))
            if body.prompt_embeds is not None:
                rows, ids, text = await anyio.to_thread.run_sync(self.engine.embedded, body.prompt_embeds)
                return await self.answering.respond(request, COMPLETIONS, tenant, body, ids,
                                                    body.requested_max_tokens, text, embeds=rows)
            ids = await anyio.to_thread.run_sync(self.engine.vocab.encode, body.text)
            return await self.answering.respond(request, COMPLETIONS, tenant, body, ids,
                                                body.requested_max_tokens, body.text)
        return await self._guarded("completions", request, handle)

    async def responses(self, request: Request) -> Response:
        async def handle(request: Request) -> Response:
            tenant = self._tenant(request)
            body = parse(ResponsesRequest, await read_json(request, self.config.max_body_bytes))
            messages = body.messages
            last_user = next((m.text for m in reversed(messages) if m.role == "user"), "")
            ids = await anyio.to_thread.run_sync(lambda: self.engine.vocab.encode_chat(messages))
            return await self.answering.respond(request, RESPONSES, tenant, body, ids, body.requested_max_tokens,
                                                last_user)
        return await self._guarded("responses", request, handle)


class _Server(uvicorn.Server):
    """uvicorn's server, whose shutdown ends by aborting the connections its graceful shutdown left open.

    A client that stopped reading (or vanished: a killed container sends no FIN) never takes what is left to
    write, so uvicorn's close waits on it forever: the socket stayed open past stop(), its transport was
    closed by nobody, and the garbage collector warned about it later, in whichever code ran then."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        for connection in list(self.server_state.connections):
            if connection.transport is not None:
                connection.transport.abort()
        await asyncio.sleep(0)  # their connection_lost runs while the loop still does


class TestbedServer:
    """The engine behind uvicorn in a background thread.

    Usage::

        with TestbedServer(build_config("incident")) as server:
            httpx.get(server.url + "/health")
    """

    __test__ = False  # not a pytest test class

    def __init__(self, config: EngineConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        cap_arenas()  # requests run in worker threads; measured: RSS crept 177 -> 249 MB over 8 bursts without it
        self.engine = ReferenceEngine(config)
        self.app = TestbedApp(self.engine)
        self._server = _Server(uvicorn.Config(
            self.app.app, host=host, port=port, log_level="warning", access_log=False,
            lifespan="off", timeout_graceful_shutdown=2,
        ))
        self._thread = threading.Thread(target=self._server.run, name="testbed", daemon=True)
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        """Origin, e.g. http://127.0.0.1:8123; the OpenAI base URL is url + "/v1"."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> TestbedServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"testbed did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self) -> None:
        """Block until the server thread ends (it runs until stop())."""
        while self._thread.is_alive():
            self._thread.join(timeout=0.5)

    def __enter__(self) -> TestbedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
