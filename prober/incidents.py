"""Incidents: findings grouped by (target, kind, victim, observer).

One faulty shard can produce hundreds of findings of one leak; an on-call engineer needs one incident per
target and tenant pair, with when it was first and last seen and how often.  Alerts, `/status` and the
reports all speak of incidents; the findings stay underneath as evidence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from prober.types import Finding, FindingKind, Severity


@dataclass(frozen=True, order=True)
class IncidentKey:
    target: str
    kind: FindingKind
    victim: str  # "" where a finding names no victim (foreign content, envelope checks)
    observer: str

    @classmethod
    def of(cls, finding: Finding) -> IncidentKey:
        return cls(finding.target, finding.kind, finding.victim_tenant or "", finding.observer_tenant)


@dataclass
class Incident:
    key: IncidentKey
    severity: Severity  # the worst of its findings
    first_seen: float
    last_seen: float
    count: int
    findings: list[Finding] = field(default_factory=list)  # when grouped from findings at hand

    def add(self, finding: Finding) -> None:
        self.severity = max(self.severity, finding.severity)
        self.first_seen = min(self.first_seen, finding.found_at)
        self.last_seen = max(self.last_seen, finding.found_at)
        self.count += 1
        self.findings.append(finding)

    def is_open(self, now: float, hold: float) -> bool:
        return now - self.last_seen < hold

    def to_json(self) -> dict[str, object]:
        return {"target": self.key.target, "kind": self.key.kind.value, "victim": self.key.victim or None,
                "observer": self.key.observer, "severity": self.severity.label, "first_seen": self.first_seen,
                "last_seen": self.last_seen, "count": self.count}


def group(findings: Iterable[Finding]) -> list[Incident]:
    """Incidents of these findings, worst first, then by when they were first seen."""
    incidents: dict[IncidentKey, Incident] = {}
    for finding in findings:
        key = IncidentKey.of(finding)
        if key not in incidents:
            incidents[key] = Incident(key, finding.severity, finding.found_at, finding.found_at, 0)
        incidents[key].add(finding)
    return sorted(incidents.values(), key=lambda i: (-i.severity, i.first_seen, i.key))
