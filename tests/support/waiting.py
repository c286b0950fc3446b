"""Waiting for a condition on a busy machine: follow progress, not a wall-clock guess.

A daemon or an engine on a 2-core machine shared with other CPU-heavy work may take minutes for what takes
seconds when idle; a fixed timeout then fails a test whose subject was working, only slowly.  `wait_for`
keeps waiting while `progress()` keeps changing (log lines, requests served, tokens sent) and fails once
nothing has moved for `idle_s`, or at `cap_s` in any case (a runaway that progresses forever)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

POLL_S = 0.2


def wait_for(condition: Callable[[], bool], what: str, *, progress: Callable[[], Hashable] | None = None,
             idle_s: float = 60.0, cap_s: float = 1_800.0, context: Callable[[], str] = lambda: "") -> None:
    """Return once `condition()` holds; raise AssertionError naming `what` (and `context()`) otherwise.

    Without `progress`, `idle_s` is a plain timeout: size it from what the condition waits for."""
    started = last_move = time.monotonic()
    seen = progress() if progress else None
    while not condition():
        now = time.monotonic()
        if progress is not None:
            current = progress()
            if current != seen:
                seen, last_move = current, now
        if now - last_move > idle_s or now - started > cap_s:
            why = (f"no progress for {idle_s:.0f} s" if now - last_move > idle_s else f"still not after {cap_s:.0f} s")
            raise AssertionError(f"timed out waiting for {what} ({why}, {now - started:.0f} s in all)\n{context()}")
        time.sleep(POLL_S)
