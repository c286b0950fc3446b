"""Whether the ledger takes writes: a canary that cannot be recorded must not be sent, so while it does not,
probing pauses, `/-/ready` says why and `leakprobe_ledger_up` is 0, until a write succeeds again.

A SQLite file deleted under the daemon is written back from the copy the process still holds open, one
housekeeping round after it was noticed (so the gap shows in `/-/ready` and the log); one replaced by another
file is never overwritten: the daemon stays not ready, and at exit saves what it recorded beside it."""

from __future__ import annotations

import asyncio
import logging

from prober.daemon.metrics import Metrics
from prober.domain.errors import LedgerError
from prober.ledger import Ledger

log = logging.getLogger("leakprobe.daemon")


class LedgerHealth:
    def __init__(self, ledger: Ledger, metrics: Metrics) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self.error: str | None = None
        metrics.process.ledger_up.set(1)

    @property
    def ok(self) -> bool:
        return self.error is None

    async def check(self) -> bool:
        """A write would succeed now, to the ledger this process opened."""
        try:
            await asyncio.to_thread(self.ledger.check_writable)
        except LedgerError as exc:
            self.failed(str(exc))
            return False
        self.recovered()
        return True

    def unready(self) -> str | None:
        """Why nothing may be sent now (checked on every `/-/ready`: a stat, no I/O on the database)."""
        problem = self.ledger.identity_problem()
        if problem is not None:
            self.failed(problem)
        return None if self.ok else f"ledger not writable: {self.error}"

    async def recover(self, keep_aside: bool = False) -> None:
        """Once a problem has been reported: restore a deleted ledger file (or, at exit, keep the open copy
        beside a file that replaced it), and say exactly what was done."""
        if self.ok:
            return
        try:
            done = await asyncio.to_thread(self.ledger.recover, keep_aside)
        except LedgerError as exc:
            log.error("%s", exc)
            return
        if done is not None:
            log.warning("%s", done)
            self.metrics.process.ledger_recoveries.inc()

    def failed(self, message: str) -> None:
        if self.ok:
            log.error("ledger not writable, probing paused until it is: %s", message)
        self.error = message
        self.metrics.process.ledger_up.set(0)

    def recovered(self) -> None:
        if not self.ok:
            log.info("ledger writable again")
        self.error = None
        self.metrics.process.ledger_up.set(1)
