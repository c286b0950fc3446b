"""One run of one job, when it is this replica's turn: the ledger writable, the job's lock and slot taken (replicas
sharing a ledger run each job once per slot), its events counted into metrics and evidence, its outcome
recorded."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from prober.config.sections import DaemonSettings
from prober.daemon.counting import RunCounter
from prober.daemon.evidence import RunEvidence
from prober.daemon.housekeeping import Housekeeper
from prober.daemon.jobs import TargetSession
from prober.daemon.ledger_health import LedgerHealth
from prober.daemon.metrics import Metrics
from prober.daemon.outcomes import JobOutcome, Skip
from prober.daemon.records import Clock, JobRecords
from prober.daemon.schedule import take_turn
from prober.domain.errors import LedgerError
from prober.domain.types import Finding
from prober.ledger import Ledger
from prober.probing.events import Event, FindingRecorded

log = logging.getLogger("leakprobe.daemon")


@dataclass(frozen=True)
class Turns:
    ledger: Ledger
    health: LedgerHealth
    records: JobRecords
    metrics: Metrics
    housekeeper: Housekeeper
    clock: Clock

    async def run(self, session: TargetSession, job: str, daemon: DaemonSettings, interval: float) -> None:
        target = session.name
        status = self.records.of(target, job)
        if status is None:
            return
        if not await self.health.check():
            self.records.skipped(target, job, Skip.LEDGER, f"ledger not writable: {self.health.error}")
            return
        try:
            turn = await take_turn(self.ledger, target, job, interval, self.clock())
        except LedgerError as exc:
            self.health.failed(str(exc))
            self.records.skipped(target, job, Skip.LEDGER, str(exc))
            return
        if isinstance(turn, Skip):
            why = "another replica is running it" if turn is Skip.LOCKED else "another replica ran it in this slot"
            self.records.skipped(target, job, turn, why)
            return
        status.running = True
        started = self.clock()
        outcome: JobOutcome | None = None
        try:
            outcome, _ = await self.counted(session, job, daemon)
        finally:
            status.running = False
            turn.release()
        await self.records.concluded(target, job, outcome, started)

    async def counted(self, session: TargetSession, job: str, daemon: DaemonSettings
                      ) -> tuple[JobOutcome, list[Finding]]:
        """The run itself, on the schedule's turn or on demand: its events counted into metrics and evidence, and
        the findings it recorded."""
        target = session.name
        self.metrics.runs.labels(target, job).inc()
        count = RunCounter(self.metrics, target, job)
        # The wall clock, as findings are stamped with it.
        evidence = RunEvidence(target, job, time.time(), session.context.tenants,
                               partial(self.housekeeper.record_checks, daemon=daemon))
        found: list[Finding] = []

        def on_event(event: Event) -> None:
            count(event)
            evidence(event)
            if isinstance(event, FindingRecorded):
                found.append(event.finding)
                log.warning("%s", event.finding.describe())  # only once it is in the ledger

        try:
            return await session.run(job, on_event), found
        finally:
            # Also when cancelled at shutdown, or cut short: the findings it recorded must name the check that made
            # them, and what it observed meanwhile re-checks what it can.
            await evidence.finish()


class InFlight:
    """The job runs going on: a shutdown lets them finish within its grace, then cancels the rest."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    @contextmanager
    def tracked(self) -> Iterator[None]:
        """Around a run, from its first line: a shutdown that begins meanwhile waits for it."""
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            yield
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def finish(self, grace: float) -> int:
        """Wait up to `grace` seconds; cancel what is still running then, and say how many were."""
        running = set(self._tasks)
        if not running:
            return 0
        _, late = await asyncio.wait(running, timeout=grace)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        return len(late)
