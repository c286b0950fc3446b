"""A target's own rate limit, read from its answers, as a pause before the next request.

Hosted APIs and gateways say what is left of a caller's allowance on every answer: OpenAI's
`x-ratelimit-remaining-requests` / `-tokens` with `x-ratelimit-reset-requests` / `-tokens` (durations such as `1s`,
`6m0s`, `20ms`), the IETF draft's `ratelimit-remaining` / `ratelimit-reset` (seconds).  Where one says nothing is
left, the next request waits until its reset instead of meeting a 429 (which wastes an attempt, and on a shared
endpoint another user's allowance too).  A 429's or a 503's `Retry-After` says when to try that request again.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import re
import time
from collections.abc import Mapping

from prober.targets.bounds import current_deadline

log = logging.getLogger("leakprobe.targets")
LIMITS = (("x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"),
          ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
          ("ratelimit-remaining", "ratelimit-reset"))
SPENT_UNKNOWN_RESET_S = 1.0  # nothing left and no reset given: wait a moment, not a guess at minutes
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3_600.0}


class Pacer:
    """When a target takes its next request: at once, or after the reset its last answers gave."""

    def __init__(self, wait_max_s: float) -> None:
        """`wait_max_s`: the longest reset waited for (a longer one is left to the 429 it brings, which ends the
        request instead of stalling the run)."""
        self.wait_max_s = wait_max_s
        self._open_at = 0.0  # time.monotonic() before which the target's rate limit says it takes no request

    async def wait(self) -> float:
        """Seconds waited for the reset, never past the run's deadline."""
        wait = self._open_at - time.monotonic()
        run = current_deadline()
        if run is not None:
            wait = min(wait, run.ends_at - time.monotonic())
        if wait <= 0:
            return 0.0
        await asyncio.sleep(wait)
        return wait

    def heard(self, headers: Mapping[str, str]) -> None:
        """An answer's headers: where they say the allowance is spent, the next request waits for the reset."""
        hold = hold_of(headers)
        if hold is None or hold[0] > self.wait_max_s:
            return
        until = time.monotonic() + hold[0]
        if until > self._open_at + 0.5:
            log.warning("the target's rate limit is spent (%s): its next request waits %.1f s", hold[1], hold[0])
        self._open_at = max(self._open_at, until)


def hold_of(headers: Mapping[str, str]) -> tuple[float, str] | None:
    """Seconds until the target takes another request and the header that says so, where one says the allowance
    is spent (the longest such reset); None while something is left or nothing is said.  `headers`: lower-case."""
    holds = []
    for remaining, reset in LIMITS:
        left = headers.get(remaining, "").strip()
        if left and _number(left) == 0:
            wait = reset_s(headers.get(reset, ""))
            holds.append((SPENT_UNKNOWN_RESET_S if wait is None else wait, f"{remaining}: {left}"))
    return max(holds) if holds else None


def reset_s(value: str) -> float | None:
    """`6m0s`, `1.5s`, `20ms`, `1h2m`, or bare seconds; None for anything else."""
    value = value.strip()
    if (seconds := _number(value)) is not None:
        return seconds
    if value and _PART.sub("", value) == "":
        return sum(float(n) * _UNIT[u] for n, u in _PART.findall(value))
    return None


def _number(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if number >= 0 else None


def retry_after_s(value: str) -> float | None:
    """`Retry-After`: seconds, or an HTTP date; None for anything else."""
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
