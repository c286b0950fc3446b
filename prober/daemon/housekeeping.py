"""The daemon's own periodic work, beside the jobs: ledger health, incidents and budgets (every replica's, so
each replica exports the same picture and a restart hides nothing), and other replicas' new canaries."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from prober.config.sections import DaemonSettings
from prober.daemon.budget import TokenBudget
from prober.daemon.ledger_health import LedgerHealth
from prober.daemon.metrics import Metrics
from prober.daemon.records import Clock
from prober.domain.errors import LedgerError
from prober.domain.incidents import RunChecks
from prober.probing.scanning import RunScanner

EVERY_S = 10.0  # ledger health, incidents, budgets
CANARY_REFRESH_S = 2.0  # other replicas' new canaries: a fact they planted is known here within this
FULL_REFRESH_S = 3600.0  # rebuild the canary index from the ledger (drops expired canaries)
CANARY_SKEW_S = 300.0  # replicas' clocks may disagree: look this far back for their new canaries


class Housekeeper:
    def __init__(self, health: LedgerHealth, metrics: Metrics, clock: Clock) -> None:
        self.health = health
        self.ledger = health.ledger
        self.metrics = metrics
        self.clock = clock
        self._canaries_seen = self._full_refresh = clock()
        self.tokens_left: dict[str, int] = {}  # per target, as the last housekeeping read the ledger

    async def incidents_and_budgets(self, targets: Iterable[str], daemon: DaemonSettings) -> None:
        await self.health.recover()
        if not await self.health.check():
            return
        try:
            budget = TokenBudget(self.ledger, daemon.tokens_per_day)
            left = {name: await budget.left(name) for name in targets}  # targets a reload removed drop out
        except LedgerError as exc:
            self.health.failed(str(exc))
            return
        self.tokens_left = left
        for name, tokens in left.items():
            self.metrics.budget_left.labels(name).set(tokens)
        await self.refresh_incidents(daemon)

    async def refresh_incidents(self, daemon: DaemonSettings) -> None:
        """Incidents as the ledger holds them now (every replica's findings, re-checks, acknowledgements)."""
        try:
            incidents = await asyncio.to_thread(self.ledger.incidents)
        except LedgerError as exc:
            self.health.failed(str(exc))
            return
        self.metrics.set_incidents(incidents, daemon.incident_hold, daemon.resolved_notice)

    async def record_checks(self, checks: RunChecks, daemon: DaemonSettings) -> None:
        """What a job run found and re-checked, into the ledger; the incidents it changed are exported at once."""
        try:
            # The wall clock, as the runner stamps findings with it: a re-check is compared with their times.
            await asyncio.to_thread(self.ledger.record_checks, checks, time.time())
        except LedgerError as exc:
            self.health.failed(str(exc))
            return
        await self.refresh_incidents(daemon)

    async def refresh_canaries(self, scanner: RunScanner) -> None:
        """Other replicas' new canaries into the index; hourly, a rebuild that also drops expired ones."""
        if not self.health.ok:
            return
        now = self.clock()
        try:
            if now - self._full_refresh > FULL_REFRESH_S:
                known = await asyncio.to_thread(self.ledger.active_canaries)
                await asyncio.to_thread(scanner.refresh, known)
                self._full_refresh = now
            else:
                fresh = await asyncio.to_thread(self.ledger.active_canaries, None,
                                                self._canaries_seen - CANARY_SKEW_S)
                scanner.add(fresh)
        except LedgerError as exc:
            self.health.failed(str(exc))
            return
        self._canaries_seen = now
