"""What one job run proves about incidents: which probe (this job, a boundary) found what, and which requests
came back fully checked, so that an incident closes only once the kind of probe that found it has run again
between the same tenants and come back clean (prober.domain.incidents).

A finding's probe goes to the ledger as soon as the finding is announced (a few at once while one write is
under way), so no replica ever reads a finding whose probe is unknown for longer than a write; what the run
re-checked clean goes when it ends, once every request of it has been judged."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import assert_never

from prober.campaign.events import CheckDone, Event, FindingRecorded, PlanReady, StepDone, SurveyDone, TargetFailed
from prober.campaign.plan import Exchange
from prober.checks.crosstalk import BOUNDARY as BURST_BOUNDARY
from prober.checks.crosstalk import CrosstalkResult
from prober.domain.incidents import Observation, RunChecks, Sighting
from prober.domain.types import Severity

Write = Callable[[RunChecks], Awaitable[None]]


class RunEvidence:
    """A listener of one run's events (findings arrive only once they are in the ledger)."""

    def __init__(self, target: str, job: str, started: float, write: Write) -> None:
        self.target, self.job, self.started = target, job, started
        self._write = write
        self._exchanges: dict[str, Exchange] = {}
        self._steps = 0
        self._observations: set[Observation] = set()
        self._faulted: set[Observation] = set()  # served with a fault found: what their answer lacks proves nothing
        self._checkless = ""  # the boundary of a check without steps (the burst's), which its re-checks are at
        self._sighted = False  # some probe's answer carried its own canary: a clean run re-checks content too
        self._unwritten: list[Sighting] = []
        self._writing: asyncio.Future[None] | None = None

    def __call__(self, event: Event) -> None:
        match event:
            case PlanReady(plan=plan):
                self._exchanges.update((e.id, e) for e in plan.exchanges)
            case StepDone(result=result):
                self._steps += 1
                self._sighted |= result.step.role == "probe" and result.answer.served and result.own_echoes > 0
                exchange = self._exchanges.get(result.exchange)
                if result.observed and exchange is not None and result.step.role in ("prime", "probe"):
                    step = result.step
                    other = exchange.victim if step.role == "probe" else exchange.observer
                    observation = Observation(step.boundary, step.tenant, other)
                    self._observations.add(observation)
                    if result.answer.served and any(f.severity > Severity.INFO for f in result.findings):
                        self._faulted.add(observation)
            case FindingRecorded(finding=finding):
                self._unwritten.append(Sighting.of(finding))
                if self._writing is None or self._writing.done():
                    self._writing = asyncio.ensure_future(self._sightings())
            case CheckDone(result=CrosstalkResult() as burst):
                self._checkless, self._sighted = BURST_BOUNDARY, burst.own_echoed > 0
            case CheckDone() | SurveyDone() | TargetFailed():
                pass  # a probe's re-check is its steps; a timing check re-checks every pair when it completes
            case _:
                assert_never(event)

    async def _sightings(self) -> None:
        while self._unwritten:
            batch, self._unwritten = self._unwritten, []
            await self._write(RunChecks(self.target, self.job, self.started, batch))

    async def finish(self, completed: bool, tenants: Sequence[str]) -> None:
        """The run ended: the last probes, then what it re-checked.  A check without boundary steps (a burst, a
        timing test) asks every tenant pair at once: completing it re-checks them all, at its own boundary.  Only a
        run that saw its own canaries come back re-checks what content shows, and only where no answer the pair
        was served there drew a finding above info: an engine that served what it must refuse answers from whatever
        its stale pages hold, and one answer without the victim's canary is luck, not a fix (a refusal, in-band or
        not, is the fix)."""
        if self._writing is not None:
            await self._writing
        await self._sightings()
        if completed and self._steps == 0:
            self._observations |= {Observation(self._checkless, observer, other)
                                   for observer in tenants for other in tenants}
        observed = {replace(o, sighted=self._sighted and o not in self._faulted) for o in self._observations}
        if observed:
            await self._write(RunChecks(self.target, self.job, self.started, observations=observed))
