"""What the daemon knows about each job's runs: when it last ran, succeeded, failed or was skipped, and why.

One place writes it to `/status`, to the metrics and (last run, last success) to the ledger, so a restart
resumes each job when it is due and staleness alerts see a job that has never succeeded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prober.daemon.metrics import Metrics
from prober.daemon.outcomes import Failure, JobOutcome, Skip
from prober.domain.errors import LedgerError
from prober.ledger import Ledger

log = logging.getLogger("leakprobe.daemon")
Clock = Callable[[], float]
# A run's plans (prompt tokens by job), with the job and the start of the run that made them: they may pace a job
# and change the day projected.
OnPlans = Callable[[str, str, float, Mapping[str, int]], None]


@dataclass
class JobStatus:
    last_run: float | None = None
    last_success: float | None = None
    last_error: str | None = None
    last_skip: str | None = None
    running: bool = False

    def to_json(self, next_run: datetime | None) -> dict[str, Any]:
        return {"running": self.running, "last_run": self.last_run, "last_success": self.last_success,
                "next_run": next_run.timestamp() if next_run else None, "last_error": self.last_error,
                "last_skip": self.last_skip}


class JobRecords:
    def __init__(self, ledger: Ledger, metrics: Metrics, clock: Clock, on_ledger_error: Callable[[str], None],
                 on_plans: OnPlans) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self.clock = clock
        self.on_ledger_error = on_ledger_error
        self.on_plans = on_plans
        self.by_target: dict[str, dict[str, JobStatus]] = {}

    def of(self, target: str, job: str) -> JobStatus | None:
        return self.by_target.get(target, {}).get(job)

    async def restore(self, target: str, job: str, started: float) -> float | None:
        """The job's last run before a restart (None: never ran); its gauges set from the ledger."""
        status = self.by_target.setdefault(target, {}).setdefault(job, JobStatus())
        last_run = await self._recall(f"last_run/{target}/{job}")
        last_success = await self._recall(f"last_success/{target}/{job}")
        status.last_run = status.last_run or last_run
        status.last_success = status.last_success or last_success
        # A job that never succeeded is stale from the daemon's start, so the rules see it.
        self.metrics.last_success.labels(target, job).set(last_success or started)
        if last_run is not None:
            self.metrics.last_run.labels(target, job).set(last_run)
        return last_run

    def keep_only(self, targets: set[str]) -> None:
        for name in set(self.by_target) - targets:
            del self.by_target[name]

    def skipped(self, target: str, job: str, skip: Skip, message: str) -> None:
        status = self.of(target, job)
        if status is not None:
            status.last_skip = f"{skip}: {message}"
        self.metrics.skips.labels(target, job, skip).inc()
        log.log(logging.INFO if skip.turn_taken else logging.WARNING, "%s %s: skipped (%s): %s", job, target,
                skip, message)

    async def concluded(self, target: str, job: str, outcome: JobOutcome, started: float) -> None:
        if outcome.tokens:
            self.metrics.spending.sent.labels(target, job).inc(outcome.tokens)
        if outcome.plans:
            self.on_plans(target, job, started, outcome.plans)
        if outcome.skip is not None:
            self.skipped(target, job, outcome.skip, outcome.message)
            return
        now = self.clock()
        status = self.of(target, job) or JobStatus()
        status.last_run = now
        self.metrics.last_run.labels(target, job).set(now)
        if outcome.blind is not None:
            self.metrics.checks.blind.labels(target, job).set(int(outcome.blind))
            if outcome.blind:
                log.warning("%s %s: blind: no answer repeated its own canary, so none could show another tenant's",
                            job, target)
        await self._remember(f"last_run/{target}/{job}", started)
        if outcome.failure is None:
            status.last_success, status.last_error = now, None
            self.metrics.last_success.labels(target, job).set(now)
            await self._remember(f"last_success/{target}/{job}", now)
            log.info("%s %s: ok in %.1f s, %s tokens", job, target, now - started, f"{outcome.tokens:,}")
            return
        status.last_error = f"{outcome.failure}: {outcome.message}"
        self.metrics.failures.labels(target, job, outcome.failure).inc()
        if outcome.failure is Failure.LEDGER:
            self.on_ledger_error(outcome.message)
        log.warning("%s %s: failed (%s): %s", job, target, outcome.failure, outcome.message)

    async def _recall(self, key: str) -> float | None:
        value = await asyncio.to_thread(self.ledger.get_meta, key)
        return None if value is None else float(value)

    async def _remember(self, key: str, value: float) -> None:
        try:
            await asyncio.to_thread(self.ledger.set_meta, key, repr(value))
        except LedgerError as exc:
            self.on_ledger_error(str(exc))
