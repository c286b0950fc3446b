"""`/probe?target=NAME&check=NAME`: one check of one target run now, for whoever must decide now (a rollout step,
an on-call engineer after a config change), as blackbox_exporter's `/probe` answers a scrape: one result.

The run is the check's daemon job, counted and recorded as any run of it (findings in the ledger first, metrics,
incidents), outside the schedule.  What it spends is the operator's, so it is guarded: one on-demand run per target
at a time, at most one per `daemon.probe_every` per target, the day's token budget as for any job (and who may call
it: prober/daemon/http.py).  The answer is the run's verdict: `pass` (it saw, and found nothing at or above
`audit.fail_on`), `fail`, or `undecided` (it did not finish, or could not see): as Prometheus exposition, or as JSON
for a webhook (Flagger proceeds on a 2xx, so a JSON answer's status says the verdict).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypedDict

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from prober.checks import Registry
from prober.config.schema import ProberConfig
from prober.daemon.jobs import TargetSession
from prober.daemon.metrics import Metrics
from prober.daemon.outcomes import JobOutcome, Skip
from prober.daemon.records import Clock
from prober.daemon.turns import Turns
from prober.domain.types import Finding, Severity

log = logging.getLogger("leakprobe.daemon")


class ProbeVerdict(StrEnum):
    PASS = "pass"  # it ran, it saw, nothing at or above the threshold
    FAIL = "fail"  # a finding at or above the threshold
    UNDECIDED = "undecided"  # it did not finish, or no answer could have shown a leak

    @property
    def status(self) -> int:
        """The HTTP status of a JSON answer: a webhook reads only that."""
        return {ProbeVerdict.PASS: 200, ProbeVerdict.FAIL: 412, ProbeVerdict.UNDECIDED: 503}[self]


class Refused(Exception):
    """Not run: the HTTP status and why (a second run of a busy target, too soon, over the budget, unknown name)."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class ProbeDoc(TypedDict):
    target: str
    check: str
    verdict: str
    message: str
    duration_seconds: float
    tokens: int
    findings: list[dict[str, object]]


@dataclass(frozen=True)
class ProbeAnswer:
    target: str
    check: str
    verdict: ProbeVerdict
    message: str
    seconds: float
    tokens: int
    findings: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, severity) -> how many

    @classmethod
    def of(cls, target: str, check: str, outcome: JobOutcome, found: list[Finding], seconds: float,
           fail_on: Severity) -> ProbeAnswer:
        counted = Counter((str(f.kind), f.severity.label) for f in found)
        worst = [f for f in found if f.severity >= fail_on]
        if worst:
            verdict, message = ProbeVerdict.FAIL, worst[0].describe()
        elif not outcome.ok:
            verdict, message = ProbeVerdict.UNDECIDED, outcome.message or str(outcome.failure or outcome.skip)
        elif outcome.blind:
            verdict, message = ProbeVerdict.UNDECIDED, "blind: no answer repeated its own tenant's canary"
        else:
            verdict, message = ProbeVerdict.PASS, f"no finding at or above {fail_on.label}"
        return cls(target, check, verdict, message, seconds, outcome.tokens, counted)

    def to_json(self) -> ProbeDoc:
        return {"target": self.target, "check": self.check, "verdict": str(self.verdict), "message": self.message,
                "duration_seconds": round(self.seconds, 3), "tokens": self.tokens,
                "findings": [{"kind": kind, "severity": severity, "count": n}
                             for (kind, severity), n in sorted(self.findings.items())]}

    def exposition(self) -> bytes:
        """The run as a scrape reads it: a registry of its own, as blackbox_exporter's probe_* series."""
        registry = CollectorRegistry()
        Gauge("leakprobe_probe_success", "1 when the run saw and found nothing at or above audit.fail_on.",
              registry=registry).set(1 if self.verdict is ProbeVerdict.PASS else 0)
        Gauge("leakprobe_probe_decided", "1 when the run finished and could see (pass or fail).",
              registry=registry).set(0 if self.verdict is ProbeVerdict.UNDECIDED else 1)
        Gauge("leakprobe_probe_duration_seconds", "How long the run took.", registry=registry).set(self.seconds)
        Gauge("leakprobe_probe_tokens", "Prompt tokens the run sent.", registry=registry).set(self.tokens)
        found = Gauge("leakprobe_probe_findings", "Findings of the run, by kind and severity.", ["kind", "severity"],
                      registry=registry)
        for (kind, severity), n in self.findings.items():
            found.labels(kind, severity).set(n)
        return generate_latest(registry)


class OnDemand:
    """Runs asked for through `/probe`: one per target at a time, one per `daemon.probe_every` per target."""

    def __init__(self, turns: Turns, metrics: Metrics, clock: Clock) -> None:
        self.turns = turns
        self.metrics = metrics
        self.clock = clock
        self._busy: set[str] = set()
        self._last: dict[str, float] = {}

    async def run(self, sessions: Mapping[str, TargetSession], checks: Registry, target: str, check: str,
                  config: ProberConfig) -> ProbeAnswer:
        """The named check's job on the named target, now (raises Refused where it may not run)."""
        every = config.daemon.probe_every
        if every is None:
            raise Refused(403, "on-demand runs are off (daemon.probe_every)")
        session = sessions.get(target)
        if session is None:
            raise Refused(404, f"no target named {target!r}; the targets: {', '.join(sessions)}")
        names = [c.name for c in checks]
        if check not in names:
            raise Refused(404, f"no check named {check!r}; the checks: {', '.join(names)}")
        self._start(target, every)
        started = self.clock()
        try:
            outcome, found = await self.turns.counted(session, check, config.daemon)
        finally:
            self._busy.discard(target)
        if outcome.skip is Skip.BUDGET:
            raise Refused(429, f"over the day's token budget: {outcome.message}")
        answer = ProbeAnswer.of(target, check, outcome, found, self.clock() - started, config.audit.fail_on)
        self.metrics.on_demand.labels(target, check, answer.verdict).inc()
        log.info("on-demand %s %s: %s (%s)", check, target, answer.verdict, answer.message)
        return answer

    def _start(self, target: str, every: float) -> None:
        """Take the target's on-demand slot (raises Refused: one going, or the last too recent)."""
        if target in self._busy:
            raise Refused(429, f"an on-demand run of {target} is going: one at a time per target", every)
        wait = self._last.get(target, -every) + every - self.clock()
        if wait > 0:
            raise Refused(429, f"the last on-demand run of {target} started {every - wait:.0f} s ago: one per "
                          f"{every:g} s (daemon.probe_every)", wait)
        self._busy.add(target)
        self._last[target] = self.clock()
