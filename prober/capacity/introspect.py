"""Reading capacity from what engines expose.  Every reader is optional: a 404, a refusal or an odd shape
means "this engine does not say", never an error.  An endpoint that failed to answer (timed out, hung up, 5xx)
is different: what it would have said is unknown, and a note on the capacity says which and why.  Each number
is recorded with the field it came from."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from prober.capacity.limits import Capacity, EngineCache, Known
from prober.capacity.version import said, served_by
from prober.targets.api import Engine
from prober.targets.credentials import Secret
from prober.targets.result import ErrorKind
from prober.targets.transport import HTTPExchange, Transport

Reader = Callable[[Transport, str, str, Secret | None], Awaitable[Capacity | None]]


def origin_of(base_url: str) -> str:
    """`http://host:8000/v1` -> `http://host:8000`: engine endpoints live at the server root."""
    url = httpx.URL(base_url)
    return str(url.copy_with(path="/", query=None, fragment=None)).rstrip("/")


class _Unanswered(Exception):
    """An introspection endpoint failed instead of answering; the message is the capacity's note."""


async def _get(transport: Transport, url: str, secret: Secret | None) -> HTTPExchange | None:
    """The exchange when the engine answered 200, None when it said "not here" (any 4xx, or 501, which
    llama.cpp gives for /metrics without --metrics); `_Unanswered` when it gave no answer at all."""
    exchange = await transport.exchange("GET", url, secret=secret)
    error, status = exchange.error, exchange.status
    if error is not None and error.kind is not ErrorKind.REDIRECT:
        failure = f"did not answer ({error.kind}: {error.message})"
    elif status is not None and status >= 500 and status != 501:
        failure = f"failed with HTTP {status}"
    else:
        return exchange if error is None and status == 200 else None
    raise _Unanswered(f"GET {httpx.URL(url).path} {failure}; what it would say is unknown")


async def _get_json(transport: Transport, url: str, secret: Secret | None) -> Any:
    exchange = await _get(transport, url, secret)
    return exchange.json()[0] if exchange else None


def _int(obj: Any, *path: str) -> int | None:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj if isinstance(obj, int) and not isinstance(obj, bool) and obj > 0 else None


async def read_sglang(transport: Transport, origin: str, base_url: str, secret: Secret | None) -> Capacity | None:
    path = "/server_info"
    info = await _get_json(transport, origin + path, secret)
    if not isinstance(info, dict):
        path = "/get_server_info"  # older builds
        info = await _get_json(transport, origin + path, secret)
    if not isinstance(info, dict) or not ({"max_total_num_tokens", "scheduler_info", "internal_states"} & info.keys()):
        return None
    flat = {**info, **(info.get("scheduler_info") or {})}

    def known(value: int | None, name: str) -> Known | None:
        return Known(value, f"sglang {path} {name}") if value else None

    pool = _int(flat, "max_total_num_tokens")
    pool_name = "max_total_num_tokens"
    states = flat.get("internal_states")
    if pool is None and isinstance(states, list) and states:
        pool, pool_name = _int(states[0], "memory_usage", "token_capacity"), "internal_states[0].token_capacity"
    mode = flat.get("disaggregation_mode")
    notes: tuple[str, ...] = ()
    dp = _int(flat, "dp_size")
    if dp and dp > 1:
        notes = (f"dp_size {dp}: the pool is per data-parallel rank",)
    return Capacity(
        engine=Engine.SGLANG,
        context_length=known(_int(flat, "context_length"), "context_length"),
        pool_tokens=known(pool, pool_name),
        max_req_input_len=known(_int(flat, "max_req_input_len"), "max_req_input_len"),
        page_size=known(_int(flat, "page_size"), "page_size"),
        disaggregation_mode=mode if isinstance(mode, str) and mode not in ("null", "") else None,
        version=said(flat.get("version"), f"sglang {path} version"), caches=_sglang_caches(flat, path), notes=notes)


def _sglang_caches(info: dict[str, Any], path: str) -> tuple[EngineCache, ...]:
    """SGLang's radix (prefix) cache and HiCache, its second tier in host memory (with a storage backend below it
    where `hicache_storage_backend` names one), as its server arguments say."""
    caches = []
    if isinstance(radix := info.get("disable_radix_cache"), bool):
        caches.append(EngineCache("prefix", not radix, f"sglang {path} disable_radix_cache"))
    if isinstance(tiered := info.get("enable_hierarchical_cache"), bool):
        storage = info.get("hicache_storage_backend")
        kind = f"host memory, storage backend {storage}" if isinstance(storage, str) and storage else "host memory"
        caches.append(EngineCache("prefix-tier2", tiered, f"sglang {path} enable_hierarchical_cache",
                                  kind if tiered else None))
    return tuple(caches)


async def read_models(transport: Transport, origin: str, base_url: str, secret: Secret | None) -> Capacity | None:
    """The API's own `/models`: vLLM's `max_model_len`, and the engine (and its version, where given) its `server`
    header names where a gateway forwards the API alone (llama.cpp's says `llama.cpp`).  Read last, so that an
    engine's own endpoints win where they answer."""
    exchange = await _get(transport, base_url.rstrip("/") + "/models", secret)
    if exchange is None:
        return None
    models, named = exchange.json()[0], served_by(exchange.headers.get("server"))
    data = models.get("data") if isinstance(models, dict) else None
    length = _int(data[0], "max_model_len") if isinstance(data, list) and data else None
    return Capacity(context_length=Known(length, "/v1/models max_model_len") if length else None,
                    engine=named[0] if named else None, version=named[1] if named else None)


_VLLM_CACHE = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


async def read_vllm(transport: Transport, origin: str, base_url: str, secret: Secret | None) -> Capacity | None:
    exchange = await _get(transport, origin + "/metrics", secret)
    match = _VLLM_CACHE.search(exchange.body.decode("utf-8", "replace")) if exchange else None
    if match is None:
        return None
    labels = dict(_LABEL.findall(match.group("labels")))
    blocks, block = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
    tokens = labels.get("kv_cache_size_tokens", "")
    if not (blocks.isdigit() and block.isdigit()):
        return Capacity(engine=Engine.VLLM, notes=("vllm:cache_config_info has no num_gpu_blocks yet",))
    page = Known(int(block), "vllm /metrics cache_config_info block_size")
    if tokens.isdigit():
        # The engine's own token count: with sliding-window layers (Gemma 3) blocks are shared between KV
        # groups, and num_gpu_blocks x block_size overstates it (measured: 2,730 x 128 = 349,440 vs 55,356).
        return Capacity(engine=Engine.VLLM, page_size=page, caches=_vllm_caches(labels),
                        pool_tokens=Known(int(tokens), "vllm /metrics cache_config_info kv_cache_size_tokens"))
    return Capacity(engine=Engine.VLLM, page_size=page, caches=_vllm_caches(labels),
                    pool_tokens=Known(int(blocks) * int(block), "vllm /metrics cache_config_info "
                                                                 "num_gpu_blocks x block_size"))


def _vllm_caches(labels: dict[str, str]) -> tuple[EngineCache, ...]:
    """vLLM's prefix cache and its CPU offload tier (`--kv-offloading-size`, by `kv_offloading_backend`), as its
    cache config says.  A KV connector set by `--kv-transfer-config` is not in it: the prefix-cache check tells that
    tier from its own answers."""
    source = "vllm /metrics cache_config_info"
    caches = []
    if (prefix := labels.get("enable_prefix_caching")) in ("True", "False"):
        caches.append(EngineCache("prefix", prefix == "True", f"{source} enable_prefix_caching"))
    if (size := labels.get("kv_offloading_size")) is not None:
        on = size not in ("None", "", "0", "0.0")
        kind = f"CPU offload, {labels.get('kv_offloading_backend', 'native')}, {size} GiB" if on else None
        caches.append(EngineCache("prefix-tier2", on, f"{source} kv_offloading_size", kind))
    return tuple(caches)


async def read_vllm_version(transport: Transport, origin: str, base_url: str, secret: Secret | None
                            ) -> Capacity | None:
    """vLLM's `GET /version`: the release alone (the engine is told by its metrics)."""
    answer = await _get_json(transport, origin + "/version", secret)
    version = said(answer.get("version"), "GET /version") if isinstance(answer, dict) and len(answer) == 1 else None
    return Capacity(version=version) if version else None


async def read_llamacpp(transport: Transport, origin: str, base_url: str, secret: Secret | None) -> Capacity | None:
    props = await _get_json(transport, origin + "/props", secret)
    if not isinstance(props, dict) or "default_generation_settings" not in props:
        return None
    n_ctx = _int(props, "default_generation_settings", "n_ctx")
    slots = _int(props, "total_slots")
    return Capacity(
        engine=Engine.LLAMACPP,
        context_length=Known(n_ctx, "llama.cpp /props default_generation_settings.n_ctx (per slot)") if n_ctx else None,
        slots=Known(slots, "llama.cpp /props total_slots") if slots else None,
        version=said(props.get("build_info"), "llama.cpp /props build_info"),
        notes=("llama.cpp does not expose its KV pool size; with --kv-unified every slot advertises the whole "
               "shared pool",))


async def read_tgi(transport: Transport, origin: str, base_url: str, secret: Secret | None) -> Capacity | None:
    info = await _get_json(transport, origin + "/info", secret)
    if not isinstance(info, dict) or "max_total_tokens" not in info:
        return None
    total, inputs = _int(info, "max_total_tokens"), _int(info, "max_input_tokens") or _int(info, "max_input_length")
    batch = _int(info, "max_batch_total_tokens")  # removed in TGI 2.3.0
    return Capacity(
        engine=Engine.TGI,
        context_length=Known(total, "tgi /info max_total_tokens") if total else None,
        max_req_input_len=Known(inputs + 1, "tgi /info max_input_tokens + 1") if inputs else None,
        pool_tokens=Known(batch, "tgi /info max_batch_total_tokens") if batch else None,
        version=said(info.get("version"), "tgi /info version"))


async def reachability(transport: Transport, base_url: str, secret: Secret | None) -> str | None:
    """Why the OpenAI-compatible API cannot be used with this credential, or None if it can."""
    check = await transport.exchange("GET", base_url.rstrip("/") + "/models", secret=secret)
    if check.error is not None and check.status is None:
        return f"cannot reach {base_url}: {check.error}"
    if check.status in (401, 403):
        return (f"the target refused the credential (HTTP {check.status}); give a tenant's key with "
                "--tenant NAME=ENVVAR")
    return None


READERS: tuple[Reader, ...] = (read_sglang, read_vllm, read_vllm_version, read_llamacpp, read_tgi, read_models)


async def _read(reader: Reader, transport: Transport, origin: str, base_url: str,
                secret: Secret | None) -> Capacity | None:
    try:
        return await reader(transport, origin, base_url, secret)
    except _Unanswered as unanswered:
        return Capacity(notes=(str(unanswered),))


async def introspect(transport: Transport, base_url: str, secret: Secret | None, *,
                     introspection_url: str | None = None, configured: Capacity | None = None) -> Capacity:
    """Everything the engine says about itself, with configured values taking precedence."""
    origin = origin_of(introspection_url or base_url)
    found = await asyncio.gather(*(_read(reader, transport, origin, base_url, secret) for reader in READERS))
    capacity = configured or Capacity()
    for part in found:
        if part is not None:
            capacity = capacity.merged(part)
    return capacity
