"""What this process has sent one endpoint: the generation requests still out, and the prompts sent a while back.

Two questions are answered here.  Was a window of the engine's counters ours alone?  Only if no other generation
request of this process started or was out during it (another job on the same target, a calibration).  And can a
prefix cache hold what the engine says it served from cache?  Only what someone sent before: cached tokens that no
earlier prompt explains were never computed for this one, while those another tenant's prompt explains are a
shared cache.  Every generation request goes through `HTTPTarget.complete`, which records it here, with the
credential it was sent with (the runner knows whose that is).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from prober.targets.credentials import Secret

KEEP_CHARS = 32 * 1024 * 1024  # the prompts kept, at most (the oldest go first)
KEEP_S = 6 * 3600.0  # and for at most this long: a cache holds a prefix for minutes to hours


@dataclass(frozen=True)
class SentPrompt:
    number: int  # in the order sent, from 0
    secret: Secret | None
    text: str
    at: float  # time.time() when it was sent


class Outbox:
    def __init__(self, keep_chars: int = KEEP_CHARS, keep_s: float = KEEP_S) -> None:
        # Generation requests started so far: also the number the next prompt sent gets, so a request that notes
        # it before it is sent can ask `shared` about the prompts sent before it (and beside it, started first).
        self.started = 0
        self.out = 0  # of those, still out
        self._sent: deque[SentPrompt] = deque()
        self._chars = 0
        self._keep_chars, self._keep_s = keep_chars, keep_s

    @contextmanager
    def sending(self, secret: Secret | None, text: str) -> Iterator[None]:
        """Around one generation request (its retries included)."""
        self._keep(SentPrompt(self.started, secret, text, time.time()))
        self.started += 1
        self.out += 1
        try:
            yield
        finally:
            self.out -= 1

    async def linger(self, seconds: float) -> None:
        """One request counted as still out for `seconds` more: a request whose client hung up stays the engine's
        until it has aborted it (and counted the abort), and that abort is this process's doing, not other users'."""
        self.out += 1
        try:
            await asyncio.sleep(seconds)
        finally:
            self.out -= 1

    @property
    def kept(self) -> int:
        """How many prompts are kept now."""
        return len(self._sent)

    def _keep(self, sent: SentPrompt) -> None:
        self._sent.append(sent)
        self._chars += len(sent.text)
        while self._sent and (self._chars > self._keep_chars or sent.at - self._sent[0].at > self._keep_s):
            self._chars -= len(self._sent.popleft().text)

    def shared(self, text: str, before: int) -> Iterator[tuple[SentPrompt, int]]:
        """Each kept prompt sent before number `before` that shares a prefix with `text`, with the prefix's length
        in characters."""
        for sent in list(self._sent):
            if sent.number >= before:
                break
            length = common_prefix(text, sent.text)
            if length:
                yield sent, length


def common_prefix(a: str, b: str) -> int:
    """Characters two strings share from the start: a binary search over slice comparisons (C memcmp), so a pair
    of megabyte prompts costs microseconds, not a Python loop per character."""
    low, high = 0, min(len(a), len(b))
    if not high or a[0] != b[0]:
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low
