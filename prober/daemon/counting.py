"""A run's events as the daemon's metrics: counts and gauges that move as requests complete, findings as they
are recorded, what a survey concluded, and the series some checks' results carry beyond their steps (each check's
own `metrics`: prober/checks)."""

from __future__ import annotations

import time
from typing import assert_never

from prober.capacity.limits import VerdictCode
from prober.daemon.metrics import BoundaryOutcome, Metrics
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
from prober.probing.results import StepResult
from prober.probing.survey import Survey


class RunCounter:
    """The listener of one job run on one target."""

    def __init__(self, metrics: Metrics, target: str, job: str) -> None:
        self.metrics, self.target, self.job = metrics, target, job

    def __call__(self, event: Event) -> None:
        m = self.metrics
        match event:
            case PlanReady(plan=plan):
                for boundary in {step.boundary for e in plan.exchanges for step in e.steps}:
                    for outcome in ("served", "refused"):
                        m.probes.labels(self.target, self.job, boundary, outcome)
            case StepDone(result=result):
                self._step(result)
            case FindingRecorded(finding=f):
                m.findings.labels(self.target, f.kind.value, f.severity.label, f.victim_tenant or "",
                                  f.observer_tenant).inc()
                m.incidents.record(f, f.check or self.job)  # the check that made it (prober/daemon/evidence.py)
            case SurveyDone(result=result):
                self._survey(result)
            case CheckDone(result=result):
                m.checks.observe(self.target, result)
            case TargetFailed() | Observed():
                pass  # a job's failure is its outcome's (JobRecords); what a request observed, its step's
            case _:
                assert_never(event)

    def _step(self, result: StepResult) -> None:
        m, answer, step = self.metrics, result.answer, result.step
        m.probes.labels(self.target, self.job, step.boundary, result.outcome).inc()
        m.probe_duration.labels(self.target, self.job).observe(answer.total_s)
        if answer.ttft_s is not None:
            m.ttft.labels(self.target, self.job).observe(answer.ttft_s)
        m.tokens_sent.labels(self.target, step.tenant).inc(result.sent_tokens)
        if step.role == "probe":
            m.boundary.labels(self.target, step.boundary).set(BoundaryOutcome.of(result))

    def _survey(self, result: Survey) -> None:
        """What a survey that reached the target learned; one that did not leaves the last verdicts to age."""
        if result.error is not None and not result.verdicts:
            return
        m, capacity = self.metrics, result.capacity
        for gauge, known in ((m.advertised, capacity.advertised), (m.pool, capacity.pool_tokens),
                             (m.input_limit, capacity.max_req_input_len or capacity.accept_limit)):
            if known is not None:
                gauge.labels(self.target).set(known.value)
        held = {v.code for v in result.verdicts}
        for code in VerdictCode:
            if code is not VerdictCode.OK:  # the absence of the others
                m.verdict.labels(self.target, code, code.severity.label).set(1 if code in held else 0)
        for gauge in (m.engine, m.known_bug, m.engine_cache):  # what is read anew replaces the last series
            gauge.remove_by_labels({"target": self.target})
        if capacity.engine is not None:
            m.engine.labels(self.target, capacity.engine, capacity.version.text if capacity.version else "").set(1)
        for bug in result.bugs:
            m.known_bug.labels(self.target, bug.public, bug.standing).set(1)
        for said in capacity.caches:
            m.engine_cache.labels(self.target, said.layer).set(1 if said.on else 0)
        m.surveyed.labels(self.target).set(time.time())
