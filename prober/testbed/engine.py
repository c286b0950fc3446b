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

import time

import numpy as np

from prober import input_embeds
from prober.input_embeds.codec import Rows
from prober.testbed import tokenizer
from prober.testbed.adapters import AdaptersBusy, AdapterSlots
from prober.testbed.backend import ModelState, make_backend
from prober.testbed.config import QUOTER, EngineConfig
from prober.testbed.generation import GenerationRequest, PagedModel, Vocabulary
from prober.testbed.media import MediaCache
from prober.testbed.paging import EngineError, EngineStats, GenerationResult, Paging
from prober.testbed.prefixes import Prefill, Prefixes
from prober.testbed.slots import SlotTable
from prober.testbed.tokenizer import PLACEHOLDER_TOKEN, TokenIds


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


class ReferenceEngine:
    """Thread-safe: requests run concurrently in worker threads; the pools serialise allocation."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.stats = EngineStats()
        self.paging = Paging(config, self.stats)
        self.backend = make_backend(config)  # a real model loads in the background
        self.prefixes = Prefixes(config)
        self.adapters = AdapterSlots(config)
        self.slots = (SlotTable(config.slots, min_reuse=config.page_size,
                                keep_on_miss=config.faults.idle_slot_keeps_conversation) if config.slots else None)
        # A real model here is text-only, and refuses images in vLLM's words for one.
        self.media = MediaCache(config.faults, config.media_cache_entries, refusal=None if config.model == QUOTER
                                else f"{config.model_name} is not a multimodal model")
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

    def embedded(self, data: str) -> tuple[Rows, TokenIds, str]:
        """A `prompt_embeds` prompt: its rows, the token ids nearest them in the reference table, and their text;
        refused (400) in vLLM's words where the engine takes no embeddings."""
        if not self.config.enable_prompt_embeds:
            raise EngineError(400, "You must set `--enable-prompt-embeds` to input `prompt_embeds`.",
                              "BadRequestError")
        try:
            rows = input_embeds.decode(data)
            ids = input_embeds.ids_of(rows)
        except ValueError as exc:
            raise EngineError(400, str(exc), "BadRequestError") from None
        return rows, ids, tokenizer.decode(ids)

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
                else self.prefixes.admit(req.tenant, req.cache_salt, written, req.adapter, req.embeds))
        self.stats.add(cached_tokens=fill.cached)
        if fill.external is not None:  # as vLLM counts a KV connector's lookups: past what the first tier held
            self.stats.add(external_queries=n - (fill.cached - fill.external), external_hits=fill.external)
        try:
            with self.adapters.applied(req, fill, n) as req:
                if self.slots is not None:
                    return self._serve_in_slot(self.slots, model, req, written)
                result = self.paging.serve(model, req, written, n, fill)
        except AdaptersBusy as exc:
            raise EngineError(503, f"{exc}, retry later", "ServiceUnavailable", in_scheduler=True) from None
        if aborted and cfg.faults.usage_reports_placeholder:
            return GenerationResult(result.text, 1, result.completion_tokens, 0, "length")
        return GenerationResult(result.text, n, result.completion_tokens, fill.cached, result.finish_reason,
                                fill.external)

    def _serve_in_slot(self, slots: SlotTable, model: PagedModel, req: GenerationRequest,
                       written: TokenIds) -> GenerationResult:
        """The slot's prompt cache counts instead of the prefix cache; a fault leaves an earlier conversation in
        front of the prompt, with nothing counted for it."""
        try:
            with slots.take(written, self.config.pool_wait_seconds) as lease:
                self.stats.add(cached_tokens=lease.cached)
                attended = np.concatenate([lease.carried, written]) if lease.carried.size else written
                carried = Prefill(len(lease.carried), (0, 0))  # what the slot held costs no prefill time
                result = self.paging.monolithic(model, req, attended, len(attended), carried)
        except TimeoutError as exc:
            raise EngineError(503, f"all slots are busy, retry later ({exc})", "ServiceUnavailable",
                              in_scheduler=True) from None
        return GenerationResult(result.text, len(written), result.completion_tokens, lease.cached,
                                result.finish_reason)

    def check_invariants(self) -> None:
        self.paging.check_invariants()
