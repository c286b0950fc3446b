"""How the reference engine's front answers a generation request: the engine's result as one JSON body or as a
stream of server-sent events, the request named by the client's ID where it gave one (the `X-Request-Id` header,
SGLang's `rid`, vLLM's `request_id`), the engine told when the client hangs up, and each answer handed to the
caller it belongs to (prober/testbed/delivery.py, where a fault hands it to others)."""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import numpy as np
import numpy.typing as npt
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from prober.testbed.config import EngineConfig
from prober.testbed.delivery import Deliveries
from prober.testbed.engine import ReferenceEngine, check_context
from prober.testbed.formats import Format
from prober.testbed.generation import GenerationRequest, Sampling
from prober.testbed.model import instruction_of
from prober.testbed.paging import EngineError, GenerationResult
from prober.testbed.protocol import ChatRequest, CompletionRequest, ResponsesRequest
from prober.testbed.tokenizer import TokenIds


def client_id(request: Request, body: ChatRequest | CompletionRequest | ResponsesRequest) -> str | None:
    """The client's name for the request, as vLLM reads one (the header first) or SGLang (`rid`)."""
    return request.headers.get("x-request-id") or body.rid or body.request_id


class Answering:
    def __init__(self, engine: ReferenceEngine) -> None:
        self.engine = engine
        self.config: EngineConfig = engine.config
        self.deliveries: Deliveries[GenerationResult] = Deliveries(engine.config.faults.keys_requests_by_client_id)

    async def respond(self, request: Request, route: Format, tenant: str,
                      body: ChatRequest | CompletionRequest | ResponsesRequest, ids: TokenIds, max_tokens: int | None,
                      instruction_text: str, embeds: npt.NDArray[np.float32] | None = None) -> Response:
        """The answer, named after the client's ID where it gave one (as vLLM's and SGLang's are), while the
        engine names the request uniquely all the same (vLLM's random suffix)."""
        cfg = self.config
        if ids.size == 0:
            raise EngineError(400, "invalid request: the prompt is empty", "BadRequestError")
        check_context(cfg, int(ids.size), max_tokens)
        named = client_id(request, body)
        unique = uuid.uuid4().hex
        req = GenerationRequest(
            request_id=f"{named}-{unique[:8]}" if named else unique,
            tenant=tenant,
            prompt_ids=ids,
            instruction=instruction_of(instruction_text),
            style=body.quote_style or cfg.quote_style,
            max_tokens=min(max_tokens or cfg.default_max_tokens, cfg.max_output_tokens),
            cache_salt=body.cache_salt,
            embeds=embeds,
            adapter=body.model if body.model in cfg.adapters else None,
            sampling=Sampling(temperature=cfg.temperature if body.temperature is None else body.temperature,
                              top_p=body.top_p or 1.0,
                              seed=secrets.randbits(63) if body.seed is None else body.seed),
        )
        meta = route.meta(named or unique, body.model or cfg.model_name, int(time.time()))
        if body.stream:
            return StreamingResponse(self._stream(request, route, meta, req, named, body.include_usage),
                                     media_type="text/event-stream")
        result = await self.deliveries.deliver(named, self._computed(request, req))
        return JSONResponse(route.answer(meta, result, cfg.reasoning))

    async def _computed(self, request: Request, req: GenerationRequest) -> GenerationResult:
        """The engine's result.  A client that hangs up before it (a closed connection, or a stream that Starlette
        stops) has its request aborted before the engine's next prefill chunk, and counted as an abort, as vLLM and
        SGLang count one, so that other users' disconnects move the counters a prober reads."""

        async def hang_up() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            req.cancelled.set()

        watch = asyncio.ensure_future(hang_up())
        try:
            return await anyio.to_thread.run_sync(self.engine.generate, req, abandon_on_cancel=True)
        except asyncio.CancelledError:
            req.cancelled.set()
            raise
        finally:
            watch.cancel()
            if req.cancelled.is_set():
                self.engine.disconnected()

    async def _stream(self, request: Request, route: Format, meta: dict[str, Any], req: GenerationRequest,
                      named: str | None, include_usage: bool) -> AsyncIterator[str]:
        try:
            result = await self.deliveries.deliver(named, self._computed(request, req))
        except EngineError as exc:
            for event in route.failed(exc):
                yield event
            return
        finished = False
        try:
            pieces = self.engine.vocab.pieces(result.text)
            grouped = ["".join(pieces[start : start + 4]) for start in range(0, len(pieces), 4)]
            for event in route.events(meta, grouped, result, self.config.reasoning, include_usage):
                yield event
            finished = True
        finally:
            if not finished:  # the client closed the stream (Starlette stops iterating when it hangs up)
                self.engine.disconnected()
