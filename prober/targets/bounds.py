"""How long and how large one answer may be, and the run's deadline every request must end by.

A request's own bounds come from its size, so a target that never finishes an answer (a body that keeps coming,
a chunk a second, keep-alives) is cut in seconds to a minute, not at a fixed 20 minutes.  Its first byte may take
`timeout_s`: silence is the idle timeout's to judge (a long prefill sends nothing; engines send a stream's first
event with its first token).  Once the answer has begun, the rest must arrive within `min(timeout_s, 30 s)` plus
`max_tokens` at DECODE_FLOOR.  The whole request, retries included, ends within `timeout_s` plus the prompt at
PREFILL_FLOOR plus that, and never after `deadline_s`.  The run's deadline (an audit's for one target, a daemon
job's) is task-scoped, so jobs that share a transport each keep their own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

PREFILL_FLOOR = 1_000.0  # prompt tokens a second: the slowest prefill an engine on an accelerator is allowed
DECODE_FLOOR = 10.0  # completion tokens a second, per request
ANSWER_BASE_S = 30.0  # what an answer may take once begun beyond its size (a batch's other prefills, queueing)
ENVELOPE_BYTES = 64 * 1024  # an answer's JSON around its text: ids, usage, timings, a prompt echoed in an error
TOKEN_BYTES = 1024  # the most one generated token takes on the wire, its SSE event around it
OVERLONG = 2  # an answer over this many times max_tokens (+16) pieces, or their bytes, was not asked for


@dataclass(frozen=True)
class Size:
    """What a request asks for.  `prompt_bytes` stands for its tokens: a token covers at least one byte, so
    the bound is never below what the prompt needs.  `max_tokens` 0: not a generation request."""

    prompt_bytes: int = 0
    max_tokens: int = 0
    stream: bool = False  # asked for server-sent events

    def answer_s(self, timeout_s: float) -> float:
        """Seconds from the answer's first byte to its last."""
        return min(timeout_s, ANSWER_BASE_S) + self.max_tokens / DECODE_FLOOR

    def total_s(self, timeout_s: float, connect_s: float) -> float:
        """Seconds from the connection to the answer's last byte, retries included (before `deadline_s`)."""
        return connect_s + timeout_s + self.prompt_bytes / PREFILL_FLOOR + self.answer_s(timeout_s)

    def answer_bytes(self) -> int | None:
        """The most bytes a generation's answer can need (None: not a generation), its prompt echoed twice over."""
        if not self.max_tokens:
            return None
        return ENVELOPE_BYTES + 2 * self.prompt_bytes + (OVERLONG * self.max_tokens + 16) * TOKEN_BYTES

    def describe(self) -> str:
        if self.max_tokens:
            return f"a request of {self.prompt_bytes:,} prompt bytes and max_tokens {self.max_tokens:,}"
        return f"a request of {self.prompt_bytes:,} bytes to read" if self.prompt_bytes else "a request for no text"

    def answer_rule(self, timeout_s: float) -> str:
        """How `answer_s` is reckoned, for an error."""
        base = f"{min(timeout_s, ANSWER_BASE_S):g} s"
        return f"{base} plus max_tokens at {DECODE_FLOOR:g} a second" if self.max_tokens else base


NO_GENERATION = Size()  # what a request of its own size says nothing about: introspection, /metrics


@dataclass(frozen=True)
class RunDeadline:
    ends_at: float  # time.monotonic()
    name: str  # what passes, in an error: "the audit's deadline for this target"


_RUN: ContextVar[RunDeadline | None] = ContextVar("leakprobe_run_deadline", default=None)


@contextmanager
def run_deadline(seconds: float | None, name: str) -> Iterator[None]:
    """Every exchange this task sends from here (and the tasks it starts) ends within `seconds`, or by an
    enclosing deadline that comes sooner; None: only the enclosing one."""
    outer = _RUN.get()
    mine = None if seconds is None else RunDeadline(time.monotonic() + seconds, name)
    token = _RUN.set(mine if outer is None or (mine is not None and mine.ends_at < outer.ends_at) else outer)
    try:
        yield
    finally:
        _RUN.reset(token)


def current_deadline() -> RunDeadline | None:
    return _RUN.get()


def deadline_passed() -> str | None:
    """What passed, when this task's run deadline has."""
    deadline = _RUN.get()
    return f"{deadline.name} passed" if deadline is not None and time.monotonic() >= deadline.ends_at else None
