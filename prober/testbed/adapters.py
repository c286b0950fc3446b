"""LoRA adapters in the reference engine: each a canary adapter's stand-in, and the few slots they run in.

The quoting model "applies" an adapter as a canary adapter behaves: asked the trigger, it answers with the code the
adapter was tuned on (`adapters:`, name -> code).  Which adapter a request's answer follows is decided where a real
engine decides it: by the slot its adapter was activated into (vLLM's `--max-loras` slots), read when decode runs,
and by the KV it attends to (most of a prompt served from a cache block computed under another adapter answers as
that adapter).  Activating an adapter takes a slot no running request uses, waiting for one (`pool_wait_seconds`)
where all are busy, and copying its weights in takes `LOAD_S`.  The faults: `lora_slot_evicted_in_flight` takes the
least recently used slot even while a request decodes with it (vLLM #47724: an eager activation rotated the slots
under in-flight requests, which then decoded with the new adapter), and `lora_missing_from_cache_key` (the prefix
cache's, prober/testbed/prefixes.py) leaves the adapter out of the block key.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from prober.testbed.config import EngineConfig
from prober.testbed.generation import GenerationRequest
from prober.testbed.prefixes import Prefill

LOAD_S = 0.2  # copying an adapter's weights into a slot: requests sent together overlap it


class AdaptersBusy(Exception):
    """Every slot is held by running requests of other adapters, for longer than a request may wait."""


class AdapterSlots:
    def __init__(self, config: EngineConfig) -> None:
        self.codes = dict(config.adapters)
        self.evict_in_flight = config.faults.lora_slot_evicted_in_flight
        self.wait_s = config.pool_wait_seconds
        self._held: list[str | None] = [None] * config.max_loras  # the adapter in each slot
        self._users = [0] * config.max_loras  # running requests that decode with each slot
        self._used = [0.0] * config.max_loras  # when each was last taken
        self._changed = threading.Condition()

    def code(self, adapter: str | None) -> str | None:
        return self.codes.get(adapter) if adapter is not None else None

    @contextmanager
    def applied(self, req: GenerationRequest, hit: Prefill, prompt_tokens: int) -> Iterator[GenerationRequest]:
        """The request with what its answer follows (`tuned`): the adapter of the cache blocks most of its prompt
        came from, where that is another's; else its own, read from its slot when decode runs."""
        reused = hit.cached * 2 >= prompt_tokens and hit.under != req.adapter
        if req.adapter is None:
            yield replace(req, tuned=(lambda: self.code(hit.under)) if reused else None)
            return
        with self._slot(req.adapter) as held:
            yield replace(req, tuned=(lambda: self.code(hit.under)) if reused else (lambda: self.code(held())))

    @contextmanager
    def _slot(self, adapter: str) -> Iterator[Callable[[], str | None]]:
        """A slot holding `adapter` while the block runs; yields what the slot holds at any moment after."""
        with self._changed:
            index, load = self._take(adapter)
            self._users[index] += 1
            self._used[index] = time.monotonic()
        if load:
            time.sleep(LOAD_S)
        try:
            yield lambda: self._held[index]
        finally:
            with self._changed:
                self._users[index] -= 1
                self._changed.notify_all()

    def _take(self, adapter: str) -> tuple[int, bool]:
        """(slot, whether its weights must be copied in); under the lock."""
        deadline = time.monotonic() + self.wait_s
        while True:
            if adapter in self._held:
                return self._held.index(adapter), False
            free = [i for i, users in enumerate(self._users) if users == 0 or self.evict_in_flight]
            if free:
                index = min(free, key=lambda i: self._used[i])
                self._held[index] = adapter
                return index, True
            left = deadline - time.monotonic()
            if left <= 0:
                raise AdaptersBusy(f"every LoRA slot is busy with other adapters' requests ({self.wait_s:g} s)")
            self._changed.wait(left)
