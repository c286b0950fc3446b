"""The serving core: admission gates, monolithic or disaggregated prefill/decode, the faults.

Request path (disaggregated):

    validate (gate 1: advertised context)  -> HTTP 400 before anything is scheduled
    schedule (gate 2: max_req_input_len)   -> abort: prompt replaced by a 1-token placeholder
    prefill: write the prompt's pages in the prefill pool
    hand-off: decode reserves pages for the *original* length, the written pages are copied over
    decode: attend over the positions it believes the prompt has, answer, free the pages

Fixed behaviour: the hand-off sees the abort and answers 400; decode refuses a transfer whose page
count does not match its reservation.  The faults (see config.Faults) remove those defences one by one.
Nothing but the answer's text tells a client that decode read someone else's pages.

What fills and reads the pages is the backend's model (backend.py): the quoting model over token ids, or a
real language model over per-layer K/V tensors (lm/), behind the same gates, hand-off and faults.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from prober.testbed.backend import ModelState, make_backend
from prober.testbed.config import QUOTER, EngineConfig
from prober.testbed.generation import GenerationRequest, PagedModel, Vocabulary
from prober.testbed.kvpool import PagePool, PoolExhausted
from prober.testbed.media import MediaCache
from prober.testbed.slots import SlotTable
from prober.testbed.tokenizer import PLACEHOLDER_TOKEN, TokenIds

WRITE_IN_FLIGHT_S = 0.05  # how long a freed page's write still runs, with `frees_pages_while_written`


class EngineError(Exception):
    """A request the engine refuses.  `in_scheduler` errors arrive inside a 200 stream when streaming."""

    def __init__(self, status: int, message: str, err_type: str, *, in_scheduler: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.in_scheduler = in_scheduler


def check_context(config: EngineConfig, n: int, max_tokens: int | None) -> None:
    """Gate 1 (SGLang's tokenizer manager): the advertised context."""
    ctx = config.context_length
    if n >= ctx:
        raise EngineError(400, f"The input ({n} tokens) is longer than the model's context length ({ctx} tokens).",
                          "BadRequestError")
    if max_tokens is not None and n + max_tokens > ctx:
        raise EngineError(
            400,
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
            f"You requested a total of {n + max_tokens} tokens: {n} tokens from the input messages "
            f"and {max_tokens} tokens for the completion. Please reduce the number of tokens in the "
            "input messages or the completion to fit within the limit.",
            "BadRequestError",
        )


def abort_message(config: EngineConfig, n: int) -> str:
    """Gate 2's refusal (SGLang's scheduler), where the abort reaches the client."""
    return (f"Input length ({n} tokens) exceeds the maximum allowed length ({config.max_req_input_len} tokens). "
            "Use a shorter input or enable --allow-auto-truncate.")


@dataclass(frozen=True)
class GenerationResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str


class PrefixCache:
    """Which page-aligned prompt prefixes were seen, keyed by tenant and cache salt; by salt alone where the fault
    shares it (vLLM's rule: equal salts, or none, share); by content alone for the storage tier.

    It records hashes only (no pages are pinned), enough to report cached_tokens and to skip the
    simulated prefill cost of a hit.
    """

    def __init__(self, page_size: int, capacity: int, shared: bool, *, content_only: bool = False) -> None:
        self.page_size = page_size
        self.capacity = capacity
        self.shared = shared
        self.content_only = content_only
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def _namespace(self, tenant: str, salt: str | None) -> bytes:
        if self.content_only:
            return b""
        salted = b"\0" + salt.encode() if salt is not None else b""
        return salted if self.shared else tenant.encode() + salted

    def _chain(self, tenant: str, salt: str | None, ids: TokenIds) -> list[bytes]:
        digest = hashlib.blake2b(self._namespace(tenant, salt), digest_size=16)
        full = len(ids) // self.page_size
        keys = []
        for page in np.split(ids[: full * self.page_size], full) if full else []:
            digest.update(page.tobytes())
            keys.append(digest.copy().digest())
        return keys

    def lookup_and_insert(self, tenant: str, salt: str | None, ids: TokenIds) -> int:
        """Cached prefix length in tokens (never the whole prompt), then remember this prompt."""
        if self.capacity == 0:
            return 0
        keys = self._chain(tenant, salt, ids)
        with self._lock:
            hits = 0
            for key in keys:
                if key not in self._seen:
                    break
                hits += 1
            for key in keys:
                self._seen[key] = None
                self._seen.move_to_end(key)
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)
        return min(hits * self.page_size, max(0, len(ids) - 1))


@dataclass
class EngineStats:
    """What the engine counts about itself, exported under SGLang's metric names (see server.py)."""

    aborted: int = 0  # scheduler aborts (gate 2, whether or not it reached every stage) and client disconnects
    transfer_failed: int = 0  # hand-offs that delivered fewer pages than decode reserved, answered or not
    running: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0


class Engine:
    """Thread-safe: requests run concurrently in worker threads; the pools serialise allocation."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.backend = make_backend(config)  # a real model loads in the background
        self.prefill_pool = PagePool("prefill", config.pool_tokens, config.page_size, config.page_reuse)
        self.decode_pool = (
            PagePool("decode", config.decode_tokens, config.page_size, config.page_reuse)
            if config.mode == "disaggregated"
            else None
        )
        self.prefix_cache = PrefixCache(
            config.page_size, config.prefix_cache_entries, config.faults.shared_prefix_cache
        )
        self.slots = (SlotTable(config.slots, min_reuse=config.page_size,
                                keep_on_miss=config.faults.idle_slot_keeps_conversation) if config.slots else None)
        self.storage_tier = (PrefixCache(config.page_size, config.prefix_cache_entries, False, content_only=True)
                             if config.faults.storage_tier_ignores_salt else None)
        # A real model here is text-only, and refuses images in vLLM's words for one.
        self.media = MediaCache(config.faults, config.media_cache_entries, refusal=None if config.model == QUOTER
                                else f"{config.model_name} is not a multimodal model")
        self.stats = EngineStats()
        self._stats_lock = threading.Lock()
        self.started_at = time.time()

    def disconnected(self) -> None:
        """A client hung up before its answer was complete: counted as an abort, as vLLM and SGLang count one, so
        that other users' disconnects move the counters a prober reads."""
        self._count(aborted=1)

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)

    # -- the model ------------------------------------------------------------------------------
    def _not_ready(self) -> EngineError:
        if self.backend.state is ModelState.FAILED:
            return EngineError(503, str(self.backend.error), "ServiceUnavailable")
        return EngineError(503, f"model {self.backend.name} is loading, retry later", "ServiceUnavailable")

    @property
    def model(self) -> PagedModel:
        model = self.backend.model
        if model is None:
            raise self._not_ready()
        return model

    @property
    def vocab(self) -> Vocabulary:
        """The tokenizer the gates count with (503 until a real model has loaded)."""
        vocab = self.backend.vocab
        if vocab is None:
            raise self._not_ready()
        return vocab

    # -- serving --------------------------------------------------------------------------------
    def generate(self, req: GenerationRequest) -> GenerationResult:
        self._count(running=1)
        try:
            return self._generate(req)
        finally:
            self._count(running=-1)

    def _generate(self, req: GenerationRequest) -> GenerationResult:
        cfg = self.config
        model = self.model
        n = len(req.prompt_ids)
        aborted = n >= cfg.max_req_input_len
        self._count(prompt_tokens=n, aborted=int(aborted))
        if aborted:
            # Gate 2 (scheduler): replace the prompt by one token to skip the long prefill.
            forwarded = cfg.mode == "disaggregated" and cfg.faults.abort_flag_unsynced
            if not forwarded:
                if cfg.faults.usage_reports_placeholder:
                    return GenerationResult("", 1, 0, 0, "length")
                raise EngineError(400, abort_message(cfg, n), "BadRequestError", in_scheduler=True)
            written = np.array([PLACEHOLDER_TOKEN], dtype=np.int32)
            cached = skipped = 0
        else:
            written = req.prompt_ids
            # A real model prefills every token (the cache is counted, its pages are not reused).
            # With slots, their prompt cache counts instead (below).
            cached = self.prefix_cache.lookup_and_insert(req.tenant, req.cache_salt, written) if not self.slots else 0
            if self.storage_tier is not None:  # consulted by every request, whoever wrote the prefix
                cached = max(cached, self.storage_tier.lookup_and_insert(req.tenant, req.cache_salt, written))
            self._count(cached_tokens=cached)
            skipped = cached if cfg.faults.cache_hit_reads_stale_pages else 0  # computed by nobody
            if model.simulates_prefill:
                self._simulate_prefill(len(written) - cached)

        if self.slots is not None:
            return self._serve_in_slot(self.slots, model, req, written)
        if self.decode_pool is None:
            result = self._serve_monolithic(model, req, written, n, skipped)
        else:
            result = self._serve_disaggregated(model, req, written, n, skipped)
        if aborted and cfg.faults.usage_reports_placeholder:
            return GenerationResult(result.text, 1, result.completion_tokens, 0, "length")
        return GenerationResult(result.text, n, result.completion_tokens, cached, result.finish_reason)

    def _serve_in_slot(self, slots: SlotTable, model: PagedModel, req: GenerationRequest,
                       written: TokenIds) -> GenerationResult:
        """The slot's prompt cache counts instead of the prefix cache; a fault leaves an earlier conversation in
        front of the prompt, with nothing counted for it."""
        try:
            with slots.take(written, self.config.pool_wait_seconds) as lease:
                self._count(cached_tokens=lease.cached)
                attended = np.concatenate([lease.carried, written]) if lease.carried.size else written
                result = self._serve_monolithic(model, req, attended, len(attended), 0)
        except TimeoutError as exc:
            raise EngineError(503, f"all slots are busy, retry later ({exc})", "ServiceUnavailable",
                              in_scheduler=True) from None
        return GenerationResult(result.text, len(written), result.completion_tokens, lease.cached,
                                result.finish_reason)

    def _simulate_prefill(self, tokens: int) -> None:
        seconds = tokens * self.config.prefill_ms_per_1k_tokens / 1e6
        if seconds > 0:
            time.sleep(seconds)

    def _allocate(self, pool: PagePool, pages: int, owner: str) -> list[int]:
        try:
            return pool.allocate(pages, owner, self.config.pool_wait_seconds)
        except PoolExhausted as exc:
            raise EngineError(503, f"KV cache is full, retry later ({exc})", "ServiceUnavailable",
                              in_scheduler=True) from None

    def _serve_monolithic(self, model: PagedModel, req: GenerationRequest, written: TokenIds,
                          n: int, skipped: int) -> GenerationResult:
        pool = self.prefill_pool
        pages = self._allocate(pool, pool.pages_for(n + req.max_tokens), req.request_id)
        with self._held(pool, pages, req) as racing:
            first = model.prefill(pool, pages, written, req, skipped)
            racing()
            return self._decode(model, pool, pages, req, n, first)

    @contextmanager
    def _held(self, pool: PagePool, pages: list[int], req: GenerationRequest) -> Iterator[Callable[[], None]]:
        """Pages freed when the block ends, or, with the fault, as soon as the write is handed off: the block
        calls what it yields there, and goes on with pages that may be another request's by then."""
        freed = False

        def racing() -> None:
            nonlocal freed
            if self.config.faults.frees_pages_while_written:
                pool.free(pages, req.request_id)
                freed = True
                time.sleep(WRITE_IN_FLIGHT_S)

        try:
            yield racing
        finally:
            if not freed:
                pool.free(pages, req.request_id)

    def _serve_disaggregated(self, model: PagedModel, req: GenerationRequest, written: TokenIds,
                             n: int, skipped: int) -> GenerationResult:
        prefill, decode = self.prefill_pool, self.decode_pool
        assert decode is not None
        sent = prefill.pages_for(len(written))
        prefill_pages = self._allocate(prefill, sent, req.request_id)
        try:
            first = model.prefill(prefill, prefill_pages, written, req, skipped)
            # Hand-off: decode reserves room for the length it was told about, plus the output.
            reserved = self._allocate(decode, decode.pages_for(n + req.max_tokens), req.request_id)
            try:
                model.transfer(prefill, prefill_pages, decode, reserved, len(written))
            except BaseException:
                decode.free(reserved, req.request_id)
                raise
        finally:
            prefill.free(prefill_pages, req.request_id)
        expected = decode.pages_for(n)
        with self._held(decode, reserved, req) as racing:
            if sent != expected:
                self._count(transfer_failed=1)
                if not self.config.faults.decode_skips_page_check:
                    raise EngineError(500, f"KV transfer incomplete for request {req.request_id}: received {sent} "
                                      f"of {expected} pages", "InternalServerError", in_scheduler=True)
            racing()
            return self._decode(model, decode, reserved, req, n, first)

    def _decode(self, model: PagedModel, pool: PagePool, pages: list[int], req: GenerationRequest, n: int,
                first: int | None) -> GenerationResult:
        if self.config.faults.offload_restore_unsynced:
            model.tear(pool, pages, n, req.sampling.seed)  # restored from the offload tier before the copy landed
        answer = model.decode(pool, pages, n, first, req)
        reason = "length" if answer.truncated else "stop"
        return GenerationResult(answer.text, n, len(answer.token_ids), 0, reason)

    def check_invariants(self) -> None:
        self.prefill_pool.check_invariants()
        if self.decode_pool is not None:
            self.decode_pool.check_invariants()
