"""Incidents: findings grouped by (target, kind, victim, observer), and when each is over.

One faulty shard can produce hundreds of findings of one leak; an on-call engineer needs one incident per
target and tenant pair, with when it was first and last seen and how often.  Alerts, `/status` and the
reports all speak of incidents; the findings stay underneath as evidence.

An incident ends on evidence, not on a timer.  Each finding came from a *check*: a daemon job at a boundary
(`campaign` at `pool+1`, `sentinel` at `sentinel`).  The incident stays open until every check that found it
has run again between the same tenants and come back clean (a *re-check*), and at least `hold` after its
last finding (the hold is a floor, so a flapping leak does not page on and off); or until an operator
acknowledges it.  A finding after an acknowledgement opens it again.  A finding no daemon check made (an
audit's, a scan's, or one recorded just before a crash) cannot be re-checked: such an incident closes once
the hold has passed, as incidents did before re-checks existed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypedDict

from prober.domain.types import Finding, FindingKind, Severity


@dataclass(frozen=True, order=True)
class IncidentKey:
    target: str
    kind: FindingKind
    victim: str  # "" where a finding names no victim (foreign content, envelope checks)
    observer: str

    @classmethod
    def of(cls, finding: Finding) -> IncidentKey:
        return cls(finding.target, finding.kind, finding.victim_tenant or "", finding.observer_tenant)

    def describe(self) -> str:
        pair = f"{self.victim} -> {self.observer}" if self.victim else f"seen by {self.observer}"
        return f"{self.kind.value} on {self.target} ({pair})"


@dataclass(frozen=True)
class Recheck:
    """A check at one boundary (a daemon job) that found an incident and must come back clean there to close it:
    when it last found it, and when it last came back clean."""

    job: str
    boundary: str
    last_found: float
    prompt_tokens: int | None = None
    last_clean: float | None = None

    @property
    def cleared(self) -> bool:
        """Re-checked clean after it last found the incident."""
        return self.last_clean is not None and self.last_clean > self.last_found

    def describe(self) -> str:
        where = f"boundary {self.boundary}" if self.boundary else "its check"
        return f"{where} ({self.job} job)"


@dataclass(frozen=True)
class Acknowledgement:
    by: str
    at: float
    note: str = ""


class Closure(StrEnum):
    RECHECKED = "rechecked"  # every check that found it came back clean (and the hold passed)
    ACKNOWLEDGED = "acknowledged"  # an operator closed it
    HELD = "held"  # no daemon check can re-check it: the hold passed since its last finding


@dataclass(frozen=True)
class Resolution:
    """How and when an incident closes (`at` may lie ahead: the hold is still running)."""

    how: Closure
    at: float
    check: Recheck | None = None  # the re-check that cleared it last
    ack: Acknowledgement | None = None

    def describe(self) -> str:
        """What a resolved notification says: why it closed, at which boundary, by whom."""
        when = _utc(self.at)
        if self.ack is not None:  # its note stays in the ledger and /status: free text, not for every page
            return f"acknowledged by {self.ack.by} at {_utc(self.ack.at)}"
        if self.check is not None and self.check.last_clean is not None:
            held = "" if self.check.last_clean >= self.at else f", closed at {when} when the hold ended"
            return f"clean re-check at {self.check.describe()} at {_utc(self.check.last_clean)}{held}"
        return f"the hold ended at {when} with no newer finding (no daemon check re-checks it)"


@dataclass
class Incident:
    key: IncidentKey
    severity: Severity  # the worst of its findings
    first_seen: float
    last_seen: float
    count: int
    findings: list[Finding] = field(default_factory=list)  # when grouped from findings at hand
    checks: list[Recheck] = field(default_factory=list)  # as the ledger keeps them
    ack: Acknowledgement | None = None  # the latest acknowledgement

    @classmethod
    def opened_by(cls, finding: Finding) -> Incident:
        """Empty, at the finding's key and time: `add` or `count_in` it next."""
        return cls(IncidentKey.of(finding), finding.severity, finding.found_at, finding.found_at, 0)

    def count_in(self, finding: Finding) -> None:
        """Its severity, times and count with the finding, which is not kept (the ledger keeps findings)."""
        self.severity = max(self.severity, finding.severity)
        self.first_seen = min(self.first_seen, finding.found_at)
        self.last_seen = max(self.last_seen, finding.found_at)
        self.count += 1

    def add(self, finding: Finding) -> None:
        """Counted in and kept, for a report of findings at hand."""
        self.count_in(finding)
        self.findings.append(finding)

    def resolution(self, hold: float) -> Resolution | None:
        """How it closes with what is known now; None while it stays open whatever the clock says."""
        if self.ack is not None and self.ack.at >= self.last_seen:
            return Resolution(Closure.ACKNOWLEDGED, self.ack.at, ack=self.ack)
        floor = self.last_seen + hold
        covered = bool(self.checks) and max(p.last_found for p in self.checks) >= self.last_seen
        if not covered:
            return Resolution(Closure.HELD, floor)
        if not all(p.cleared for p in self.checks):
            return None
        last = max(self.checks, key=lambda p: p.last_clean or 0.0)
        return Resolution(Closure.RECHECKED, max(floor, last.last_clean or 0.0), check=last)

    def is_open(self, now: float, hold: float) -> bool:
        closed = self.resolution(hold)
        return closed is None or now < closed.at

    def pending(self) -> list[Recheck]:
        """The checks whose re-check it still waits for."""
        return [p for p in self.checks if not p.cleared]

    def to_json(self) -> IncidentDoc:
        return {"target": self.key.target, "kind": self.key.kind.value, "victim": self.key.victim or None,
                "observer": self.key.observer, "severity": self.severity.label, "first_seen": self.first_seen,
                "last_seen": self.last_seen, "count": self.count}

    def state_json(self, hold: float, now: float | None = None) -> IncidentStateDoc:
        """With where it stands after `hold` seconds without a sighting: open or closed, and what it waits for."""
        now = time.time() if now is None else now
        closed = self.resolution(hold)
        is_open = closed is None or now < closed.at
        return {
            **self.to_json(),
            "state": "open" if is_open else "closed",
            "checks": [{"job": p.job, "boundary": p.boundary, "prompt_tokens": p.prompt_tokens,
                        "last_found": p.last_found, "last_clean": p.last_clean} for p in self.checks],
            "waiting_for": ([p.describe() for p in self.pending()] or
                            ([f"the hold, until {_utc(closed.at)}"] if closed and is_open else [])),
            "acknowledged": None if self.ack is None else {"by": self.ack.by, "at": self.ack.at,
                                                           "note": self.ack.note},
            "closed": None if is_open or closed is None else {"how": closed.how.value, "at": closed.at,
                                                               "why": closed.describe()}}


class IncidentDoc(TypedDict):
    target: str
    kind: str
    victim: str | None
    observer: str
    severity: str
    first_seen: float
    last_seen: float
    count: int


class IncidentCheckDoc(TypedDict):
    job: str
    boundary: str
    prompt_tokens: int | None
    last_found: float
    last_clean: float | None


class AckDoc(TypedDict):
    by: str
    at: float
    note: str


class ClosedDoc(TypedDict):
    how: str
    at: float
    why: str


class IncidentStateDoc(IncidentDoc):
    state: str  # open | closed
    checks: list[IncidentCheckDoc]
    waiting_for: list[str]
    acknowledged: AckDoc | None
    closed: ClosedDoc | None


@dataclass(frozen=True)
class Sighting:
    """A finding of an incident by a check, as a job run records it."""

    key: IncidentKey
    boundary: str
    found_at: float
    prompt_tokens: int | None

    @classmethod
    def of(cls, finding: Finding) -> Sighting:
        context = finding.context
        return cls(IncidentKey.of(finding), context.boundary or "", finding.found_at, context.prompt_tokens)


# What only an answer's text shows: a run whose answers never carried their own canary (blind) cannot re-check these.
CONTENT_KINDS = frozenset({FindingKind.CROSS_TENANT_ECHO, FindingKind.CROSS_REQUEST_ECHO, FindingKind.FOREIGN_CONTENT})
# What only the engine's failure counters show: a request whose counters were not read cannot re-check these.
COUNTER_KINDS = frozenset({FindingKind.COUNTED_FAILURE})


@dataclass(frozen=True)
class Observation:
    """A request of a job run whose answer was fully checked: the `observer` tenant's request at `boundary`,
    where it could have carried `other`'s data (its canaries, its cache state).  `sighted`: the check's answers
    showed their own canaries and no answer served to this pair here drew a finding above info, so a clean one
    also re-checks what only content shows.  `counted`: the engine's failure counters were read around it as
    evidence, so a clean one also re-checks what only counters show."""

    boundary: str
    observer: str
    other: str
    sighted: bool = True
    counted: bool = False


@dataclass
class RunChecks:
    """What one job run found and what it re-checked, written to the ledger when the run ends (one
    transaction).  An observation re-checks clean, at its boundary, the incidents of its tenant pair (and
    those that name no victim) that were last found before the run started: whatever this run found there
    is newer than that, so it stays open."""

    target: str
    job: str
    started: float
    sightings: list[Sighting] = field(default_factory=list)
    observations: set[Observation] = field(default_factory=set)


def group(findings: Iterable[Finding]) -> list[Incident]:
    """Incidents of these findings, worst first, then by when they were first seen."""
    incidents: dict[IncidentKey, Incident] = {}
    for finding in findings:
        key = IncidentKey.of(finding)
        if key not in incidents:
            incidents[key] = Incident.opened_by(finding)
        incidents[key].add(finding)
    return sorted(incidents.values(), key=lambda i: (-i.severity, i.first_seen, i.key))


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))
