"""Conversation slots with a prompt cache, as llama.cpp's server keeps them (`--parallel`, `cache_prompt`).

Each slot keeps the prompt of the last request it served.  A new request goes to the idle slot whose kept prompt
shares the longest prefix with its own, else to the one idle longest.  A shared prefix of at least `min_reuse`
tokens is reused (reported as cached); anything shorter (the chat template every prompt opens with) is no match,
and the slot is cleared and its state looked up in the prompt cache -- unless the fault keeps it, as a cache
`load()` that reported success with nothing selected did (llama.cpp #27148, #27624): the request is then answered
over the earlier conversation followed by its own prompt, with nothing cached to show for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from prober.testbed.tokenizer import TokenIds


@dataclass
class Slot:
    id: int
    kept: TokenIds = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    last_used: float = 0.0
    busy: bool = False


@dataclass(frozen=True)
class Lease:
    slot: Slot
    cached: int  # tokens of the prompt the slot already held (reused)
    carried: TokenIds  # an earlier conversation the slot was not cleared of (the fault), to be attended first


class SlotTable:
    def __init__(self, count: int, *, min_reuse: int, keep_on_miss: bool) -> None:
        self.slots = [Slot(i) for i in range(count)]
        self.min_reuse = min_reuse
        self.keep_on_miss = keep_on_miss
        self._idle = threading.Condition()

    @contextmanager
    def take(self, prompt: TokenIds, wait_s: float) -> Iterator[Lease]:
        """An idle slot for `prompt` (waiting up to `wait_s` for one), kept busy until the block ends, then
        keeping `prompt` for the next request."""
        with self._idle:
            if not self._idle.wait_for(lambda: any(not s.busy for s in self.slots), timeout=wait_s):
                raise TimeoutError(f"no idle slot of {len(self.slots)} within {wait_s:g} s")
            idle = [s for s in self.slots if not s.busy]
            common = {s.id: _common_prefix(s.kept, prompt) for s in idle}
            slot = max(idle, key=lambda s: (common[s.id], -s.last_used))
            reused = common[slot.id] if common[slot.id] >= self.min_reuse else 0
            cached = min(reused, max(0, len(prompt) - 1))
            carried = slot.kept if cached == 0 and self.keep_on_miss else np.zeros(0, dtype=np.int32)
            slot.busy = True
        try:
            yield Lease(slot, cached, carried)
        finally:
            with self._idle:
                slot.kept, slot.last_used, slot.busy = prompt, time.monotonic(), False
                self._idle.notify()


def _common_prefix(a: TokenIds, b: TokenIds) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n
