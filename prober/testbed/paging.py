"""How the reference engine serves a prompt on its KV pages: allocated, prefilled a chunk at a time, handed from the
prefill pool to the decode pool where prefill and decode are split, decoded and freed; and where the faults of that
path strike (decode skipping the page check, pages freed while written, an offload restore not synced).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from prober.testbed.config import EngineConfig
from prober.testbed.generation import GenerationRequest, PagedModel
from prober.testbed.kvpool import PagePool, PoolExhausted
from prober.testbed.prefixes import Prefill
from prober.testbed.tokenizer import TokenIds

WRITE_IN_FLIGHT_S = 0.05  # how long a freed page's write still runs, with `frees_pages_while_written`


class EngineError(Exception):
    """A request the engine refuses.  `in_scheduler` errors arrive inside a 200 stream when streaming."""

    def __init__(self, status: int, message: str, err_type: str, *, in_scheduler: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.in_scheduler = in_scheduler


@dataclass(frozen=True)
class GenerationResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str
    external_cached_tokens: int | None = None  # of `cached_tokens`, the second tier's (None: no second tier)


@dataclass
class EngineStats:
    """What the engine counts about itself, exported under SGLang's metric names (see server.py)."""

    aborted: int = 0  # scheduler aborts (gate 2, whether or not it reached every stage) and client disconnects
    transfer_failed: int = 0  # hand-offs that delivered fewer pages than decode reserved, answered or not
    running: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    external_queries: int = 0  # prompt tokens the second tier was asked for: what the first tier did not hold
    external_hits: int = 0  # of those, what it served
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)


def _sleep(seconds: float) -> None:
    """What the quoting model's work is taken to cost (it costs nothing itself)."""
    if seconds > 0:
        time.sleep(seconds)


class Paging:
    """The prefill pool, and the decode pool where prefill and decode are split (thread-safe: the pools serialise
    allocation)."""

    def __init__(self, config: EngineConfig, stats: EngineStats) -> None:
        self.config = config
        self.stats = stats
        self.prefill_pool = PagePool("prefill", config.pool_tokens, config.page_size, config.page_reuse)
        self.decode_pool = (PagePool("decode", config.decode_tokens, config.page_size, config.page_reuse)
                            if config.mode == "disaggregated" else None)

    def serve(self, model: PagedModel, req: GenerationRequest, written: TokenIds, n: int,
              fill: Prefill) -> GenerationResult:
        """`written` (the prompt, or the abort's placeholder) prefilled, and decoded as if the prompt had `n` tokens."""
        if self.decode_pool is None:
            return self.monolithic(model, req, written, n, fill)
        return self._disaggregated(model, req, written, n, fill)

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

    def monolithic(self, model: PagedModel, req: GenerationRequest, written: TokenIds,
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

    def _disaggregated(self, model: PagedModel, req: GenerationRequest, written: TokenIds,
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
