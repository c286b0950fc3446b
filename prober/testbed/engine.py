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

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from prober.testbed.adapters import AdaptersBusy, AdapterSlots
from prober.testbed.backend import ModelState, make_backend
from prober.testbed.config import QUOTER, EngineConfig
from prober.testbed.generation import GenerationRequest, PagedModel, Vocabulary
from prober.testbed.kvpool import PagePool, PoolExhausted
from prober.testbed.media import MediaCache
from prober.testbed.prefixes import Prefill, Prefixes
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


@dataclass
class EngineStats:
    """What the engine counts about itself, exported under SGLang's metric names (see server.py)."""

    aborted: int = 0  # scheduler aborts (gate 2, whether or not it reached every stage) and client disconnects
    transfer_failed: int = 0  # hand-offs that delivered fewer pages than decode reserved, answered or not
    running: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)


def _sleep(seconds: float) -> None:
    """What the quoting model's work is taken to cost (it costs nothing itself)."""
    if seconds > 0:
        time.sleep(seconds)


class Engine:
    """Thread-safe: requests run concurrently in worker threads; the pools serialise allocation."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.backend = make_backend(config)  # a real model loads in the background
        self.prefill_pool = PagePool("prefill", config.pool_tokens, config.page_size, config.page_reuse)
        self.decode_pool = (PagePool("decode", config.decode_tokens, config.page_size, config.page_reuse)
                            if config.mode == "disaggregated" else None)
        self.prefixes = Prefixes(config)
        self.adapters = AdapterSlots(config)
        self.slots = (SlotTable(config.slots, min_reuse=config.page_size,
                                keep_on_miss=config.faults.idle_slot_keeps_conversation) if config.slots else None)
        # A real model here is text-only, and refuses images in vLLM's words for one.
        self.media = MediaCache(config.faults, config.media_cache_entries, refusal=None if config.model == QUOTER
                                else f"{config.model_name} is not a multimodal model")
        self.stats = EngineStats()
        self.started_at = time.time()

    def disconnected(self) -> None:
        """A client hung up before its answer was complete: counted as an abort, as vLLM and SGLang count one, so
        that other users' disconnects move the counters a prober reads."""
        self.stats.add(aborted=1)

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
        self.stats.add(running=1)
        try:
            return self._generate(req)
        finally:
            self.stats.add(running=-1)

    def _generate(self, req: GenerationRequest) -> GenerationResult:
        cfg = self.config
        model = self.model
        n = len(req.prompt_ids)
        aborted = n >= cfg.max_req_input_len
        self.stats.add(prompt_tokens=n, aborted=int(aborted))
        if aborted:
            # Gate 2 (scheduler): replace the prompt by one token to skip the long prefill.
            forwarded = cfg.mode == "disaggregated" and cfg.faults.abort_flag_unsynced
            if not forwarded:
                if cfg.faults.usage_reports_placeholder:
                    return GenerationResult("", 1, 0, 0, "length")
                raise EngineError(400, abort_message(cfg, n), "BadRequestError", in_scheduler=True)
            written = np.array([PLACEHOLDER_TOKEN], dtype=np.int32)
        else:
            written = req.prompt_ids
        # A real model prefills every token but the stale ones (the cache is counted, its pages are not reused);
        # with slots, their prompt cache counts instead of the prefix cache.
        fill = (Prefill(0, (0, 0)) if aborted or self.slots is not None
                else self.prefixes.admit(req.tenant, req.cache_salt, written, req.adapter))
        self.stats.add(cached_tokens=fill.cached)
        try:
            with self.adapters.applied(req, fill, n) as req:
                if self.slots is not None:
                    return self._serve_in_slot(self.slots, model, req, written)
                if self.decode_pool is None:
                    result = self._serve_monolithic(model, req, written, n, fill)
                else:
                    result = self._serve_disaggregated(model, req, written, n, fill)
        except AdaptersBusy as exc:
            raise EngineError(503, f"{exc}, retry later", "ServiceUnavailable", in_scheduler=True) from None
        if aborted and cfg.faults.usage_reports_placeholder:
            return GenerationResult(result.text, 1, result.completion_tokens, 0, "length")
        return GenerationResult(result.text, n, result.completion_tokens, fill.cached, result.finish_reason)

    def _serve_in_slot(self, slots: SlotTable, model: PagedModel, req: GenerationRequest,
                       written: TokenIds) -> GenerationResult:
        """The slot's prompt cache counts instead of the prefix cache; a fault leaves an earlier conversation in
        front of the prompt, with nothing counted for it."""
        try:
            with slots.take(written, self.config.pool_wait_seconds) as lease:
                self.stats.add(cached_tokens=lease.cached)
                attended = np.concatenate([lease.carried, written]) if lease.carried.size else written
                carried = Prefill(len(lease.carried), (0, 0))  # what the slot held costs no prefill time
                result = self._serve_monolithic(model, req, attended, len(attended), carried)
        except TimeoutError as exc:
            raise EngineError(503, f"all slots are busy, retry later ({exc})", "ServiceUnavailable",
                              in_scheduler=True) from None
        return GenerationResult(result.text, len(written), result.completion_tokens, lease.cached,
                                result.finish_reason)

    def _prefill(self, model: PagedModel, pool: PagePool, pages: list[int], ids: TokenIds, req: GenerationRequest,
                 fill: Prefill) -> int | None:
        """The prompt's KV written a chunk at a time (`prefill_chunk_tokens`), each chunk's whole pages then published
        to the prefix cache; a request whose client hung up is aborted before its next chunk (vLLM and SGLang abort
        a request whose client went away between scheduler steps), its pages freed by the caller."""
        chunk, first = self.config.prefill_chunk_tokens, None
        for start in range(0, len(ids), chunk):
            if req.cancelled.is_set():
                raise EngineError(499, f"request {req.request_id} aborted: its client closed the connection",
                                  "ClientClosedRequest", in_scheduler=True)
            end = min(len(ids), start + chunk)
            if model.simulates_time:
                cost = end - max(start, min(end, fill.cached))  # cached tokens cost no time
                _sleep(cost * self.config.prefill_ms_per_1k_tokens / 1e6)
            for low, high in fill.computed(start, end):
                first = model.prefill(pool, pages, ids[:high], req, low)
            fill.written(end, pool.page_size)
        return first

    def _allocate(self, pool: PagePool, pages: int, owner: str) -> list[int]:
        try:
            return pool.allocate(pages, owner, self.config.pool_wait_seconds)
        except PoolExhausted as exc:
            raise EngineError(503, f"KV cache is full, retry later ({exc})", "ServiceUnavailable",
                              in_scheduler=True) from None

    def _serve_monolithic(self, model: PagedModel, req: GenerationRequest, written: TokenIds,
                          n: int, fill: Prefill) -> GenerationResult:
        pool = self.prefill_pool
        pages = self._allocate(pool, pool.pages_for(n + req.max_tokens), req.request_id)
        with self._held(pool, pages, req) as racing:
            first = self._prefill(model, pool, pages, written, req, fill)
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
                             n: int, fill: Prefill) -> GenerationResult:
        prefill, decode = self.prefill_pool, self.decode_pool
        assert decode is not None
        sent = prefill.pages_for(len(written))
        prefill_pages = self._allocate(prefill, sent, req.request_id)
        try:
            first = self._prefill(model, prefill, prefill_pages, written, req, fill)
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
                self.stats.add(transfer_failed=1)
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
        if model.simulates_time:
            _sleep(len(answer.token_ids) * self.config.decode_ms_per_token / 1e3)
        reason = "length" if answer.truncated else "stop"
        return GenerationResult(answer.text, n, len(answer.token_ids), 0, reason)

    def check_invariants(self) -> None:
        self.prefill_pool.check_invariants()
        if self.decode_pool is not None:
            self.decode_pool.check_invariants()
