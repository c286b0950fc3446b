"""The daily token budget per target, kept in the ledger so it survives restarts (and, on a shared ledger,
is counted once across replicas).  A job reserves its whole plan before sending anything, so a job that
would exceed the budget never starts, and gives back what it did not send."""

from __future__ import annotations

import asyncio
import time

from prober.ledger import Ledger


def utc_day(at: float | None = None) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() if at is None else at))


class TokenBudget:
    def __init__(self, ledger: Ledger, per_day: int) -> None:
        self.ledger = ledger
        self.per_day = per_day

    async def reserve(self, target: str, tokens: int) -> str | None:
        """The day the tokens were reserved on, or None when they would not fit today."""
        day = utc_day()
        ok = await asyncio.to_thread(self.ledger.spend_tokens, target, day, tokens, self.per_day)
        return day if ok else None

    async def release(self, target: str, day: str, tokens: int) -> None:
        if tokens > 0:
            await asyncio.to_thread(self.ledger.refund_tokens, target, day, tokens)

    async def left(self, target: str) -> int:
        spent = await asyncio.to_thread(self.ledger.tokens_spent, target, utc_day())
        return max(0, self.per_day - spent)
