"""What one job run proves about incidents: which check at which boundary found what, and which requests came back
fully checked, so that an incident closes only once the check that found it has run again between the same tenants
and come back clean (prober.domain.incidents).

One contract for every check: what it finds arrives as `FindingRecorded`, what it observed as `Observed` (a judged
request: its boundary, its tenant, whose data its answer could have carried, whether the engine's counters were read
around it), and whether it could see content at all with `CheckDone` (its result's sight).  Nothing here knows one
check from another.  A finding and an observation belong to the check that made them, which is the job's own but
for the probe-shape controls a check runs first where no shape was chosen yet: those are the `shapes` check's, whose
job re-checks them, as does the next run of any check where those controls drew a finding (it chooses again).

A finding's check goes to the ledger as soon as the finding is announced (a few at once while one write is under
way), so no replica ever reads a finding whose check is unknown for longer than a write; what the run re-checked
clean goes when it ends, once every request of it has been judged."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import assert_never

from prober.domain.incidents import Observation, RunChecks, Sighting
from prober.probing.events import (
    CheckDone,
    Event,
    FindingRecorded,
    Observed,
    PlanReady,
    StepDone,
    SurveyDone,
    TargetFailed,
)

Write = Callable[[RunChecks], Awaitable[None]]


@dataclass
class _Seen:
    """What a check's requests at one boundary showed of one tenant pair."""

    faulted: bool = False  # an answer served there drew a finding above info: its lack of the other's data is luck
    counted: bool = False  # the engine's failure counters were read around one of them


class RunEvidence:
    """A listener of one run's events (findings arrive only once they are in the ledger)."""

    def __init__(self, target: str, job: str, started: float, tenants: Sequence[str], write: Write) -> None:
        """`tenants`: whose data an answer scanned for every canary could have carried."""
        self.target, self.job, self.started = target, job, started
        self._tenants = tuple(tenants)
        self._write = write
        self._seen: dict[tuple[str, str, str, str], _Seen] = {}  # (check, boundary, observer, other)
        self._sighted: dict[str, bool] = {}  # by check: its answers carried their own canaries
        self._unwritten: list[tuple[str, Sighting]] = []  # (check, sighting)
        self._writing: asyncio.Future[None] | None = None

    def __call__(self, event: Event) -> None:
        match event:
            case Observed() as seen:
                for other in seen.others if seen.others is not None else self._tenants:
                    pair = self._seen.setdefault((seen.check, seen.boundary, seen.observer, other), _Seen())
                    pair.faulted |= seen.faulted
                    pair.counted |= seen.counted
            case CheckDone(result=result):
                self._sighted[result.check] = result.sighted
            case FindingRecorded(finding=finding):
                self._unwritten.append((finding.check or self.job, Sighting.of(finding)))
                if self._writing is None or self._writing.done():
                    self._writing = asyncio.ensure_future(self._sightings())
            case SurveyDone() | PlanReady() | StepDone() | TargetFailed():
                pass  # what a request observed is its `Observed`
            case _:
                assert_never(event)

    async def _sightings(self) -> None:
        while self._unwritten:
            batch, self._unwritten = self._unwritten, []
            for check in dict.fromkeys(check for check, _ in batch):
                await self._write(RunChecks(self.target, check, self.started,
                                            [s for c, s in batch if c == check]))

    async def finish(self) -> None:
        """The run ended, however: its last findings, then what it re-checked.  Only a check that saw its own
        canaries come back re-checks what content shows, and only where no answer served to the pair there drew a
        finding above info: an engine that served what it must refuse answers from whatever its stale pages hold, and
        one answer without the victim's canary is luck, not a fix (a refusal, in-band or not, is the fix)."""
        if self._writing is not None:
            await self._writing
        await self._sightings()
        by_check: dict[str, set[Observation]] = {}
        for (check, boundary, observer, other), seen in self._seen.items():
            sighted = self._sighted.get(check, False) and not seen.faulted
            by_check.setdefault(check, set()).add(Observation(boundary, observer, other, sighted, seen.counted))
        for check, observed in by_check.items():
            await self._write(RunChecks(self.target, check, self.started, observations=observed))
