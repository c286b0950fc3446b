"""Every metric the daemon exports, in one place, on a registry passed in (never the process-global one).

Metrics are a view of results: `listener(target, job)` turns the runner's typed events into counts and
gauges as requests complete, and the jobs set what they conclude (capacity, verdicts, budget, last
success).  Nothing is probed on scrape: an exposition shows the last completed results.  Labels are
bounded (targets and tenants come from the config; kinds, outcomes and boundaries are fixed sets) and
never carry a canary id, an excerpt, a URL or a key.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from prober import __version__
from prober.campaign.events import Event, FindingRecorded, Listener, StepDone, SurveyDone, TargetFailed
from prober.campaign.results import StepResult
from prober.campaign.survey import PreflightResult
from prober.incidents import Incident, IncidentKey
from prober.types import Finding, Severity

# Wide enough for a 1M-token prefill on real hardware (minutes) and a cached 100-token answer (ms).
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
VERDICTS = {"capacity_inversion": Severity.CRITICAL, "thin_margin": Severity.WARNING,
            "shared_pool_oversubscribed": Severity.WARNING, "capacity_unknown": Severity.INFO}


class BoundaryOutcome:
    """Values of `leakprobe_boundary_last_outcome` (a state timeline maps them to words and colours)."""

    NO_ANSWER = 0  # timeout, connection, malformed, 5xx: the engine gave no verdict
    SERVED = 1  # served, as a correct engine does
    REFUSED = 2  # refused, as a correct engine does
    SERVED_OVER_LIMIT = 3  # served a prompt a correct engine must refuse (the incident's first symptom)
    REFUSED_UNDER_LIMIT = 4  # refused a prompt the capacity says fits

    @classmethod
    def of(cls, result: StepResult) -> int:
        answer, expected = result.answer, result.step.expect_served
        if answer.served:
            return cls.SERVED if expected else cls.SERVED_OVER_LIMIT
        if answer.refused:
            return cls.REFUSED_UNDER_LIMIT if expected else cls.REFUSED
        return cls.NO_ANSWER


class IncidentCollector(Collector):
    """Incidents as they stand in the ledger (all replicas' findings), open ones computed at scrape time
    from their last finding and the configured hold."""

    def __init__(self) -> None:
        self.by_key: dict[IncidentKey, Incident] = {}
        self.hold = 3600.0

    @property
    def incidents(self) -> list[Incident]:
        return list(self.by_key.values())

    def replace(self, incidents: Iterable[Incident]) -> None:
        """What the ledger holds now (every replica's findings)."""
        self.by_key = {i.key: i for i in incidents}

    def record(self, finding: Finding) -> None:
        """A finding this process just persisted, shown before the next read of the ledger."""
        key = IncidentKey.of(finding)
        if key in self.by_key:
            incident = self.by_key[key]
            incident.severity = max(incident.severity, finding.severity)
            incident.last_seen = max(incident.last_seen, finding.found_at)
            incident.count += 1
        else:
            self.by_key[key] = Incident(key, finding.severity, finding.found_at, finding.found_at, 1)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["target", "kind", "victim", "observer"]
        last = GaugeMetricFamily("leakprobe_last_finding_timestamp_seconds",
                                 "When the latest finding of this incident was recorded (any replica).", labels=labels)
        first = GaugeMetricFamily("leakprobe_incident_first_seen_timestamp_seconds",
                                  "When the first finding of this incident was recorded.", labels=labels)
        count = GaugeMetricFamily("leakprobe_incident_findings", "Findings recorded for this incident.",
                                  labels=labels)
        opened = GaugeMetricFamily("leakprobe_incident_open",
                                   "1 while the incident's last finding is within the hold, else 0.", labels=labels)
        now = time.time()
        for incident in list(self.by_key.values()):
            key = incident.key
            values = [key.target, key.kind.value, key.victim, key.observer]
            last.add_metric(values, incident.last_seen)
            first.add_metric(values, incident.first_seen)
            count.add_metric(values, incident.count)
            opened.add_metric(values, 1.0 if incident.is_open(now, self.hold) else 0.0)
        hold = GaugeMetricFamily("leakprobe_incident_hold_seconds",
                                 "How long an incident stays open after its last finding (daemon.incident_hold).")
        hold.add_metric([], self.hold)
        yield from (last, first, count, opened, hold)


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        target_job = ["target", "job"]
        self.findings = Counter("leakprobe_findings", "Findings recorded (persisted first), by kind and tenant pair.",
                                ["target", "kind", "severity", "victim", "observer"], registry=registry)
        self.probes = Counter("leakprobe_probes", "Requests sent and answered, by boundary and outcome.",
                              ["target", "job", "boundary", "outcome"], registry=registry)
        self.probe_duration = Histogram("leakprobe_probe_duration_seconds", "Request time, first byte sent to last "
                                        "byte received.", target_job, buckets=DURATION_BUCKETS, registry=registry)
        self.ttft = Histogram("leakprobe_time_to_first_token_seconds", "Time to the first text of an answer.",
                              target_job, buckets=DURATION_BUCKETS, registry=registry)
        self.boundary = Gauge("leakprobe_boundary_last_outcome", "Last outcome at a boundary: 0 no answer, 1 served, "
                              "2 refused, 3 served over the limit, 4 refused under it.", ["target", "boundary"],
                              registry=registry)
        self.request_errors = Counter("leakprobe_target_request_errors", "Requests that got no verdict from the "
                                      "engine, by error kind.", ["target", "kind"], registry=registry)
        self.tokens_sent = Counter("leakprobe_tokens_sent", "Prompt tokens sent, by tenant.", ["target", "tenant"],
                                   registry=registry)
        self.budget = Gauge("leakprobe_token_budget_tokens", "Prompt tokens a target may be sent per UTC day.",
                            ["target"], registry=registry)
        self.budget_left = Gauge("leakprobe_token_budget_remaining_tokens", "Prompt tokens left today (all "
                                 "replicas).", ["target"], registry=registry)
        self.advertised = Gauge("leakprobe_target_advertised_context_tokens", "Context length the API advertises.",
                                ["target"], registry=registry)
        self.pool = Gauge("leakprobe_target_kv_pool_tokens", "Tokens the engine's KV pool holds.", ["target"],
                          registry=registry)
        self.input_limit = Gauge("leakprobe_target_input_limit_tokens", "Longest prompt a correct engine serves.",
                                 ["target"], registry=registry)
        self.verdict = Gauge("leakprobe_capacity_verdict", "1 where preflight's last verdict holds, else 0.",
                             ["target", "verdict", "severity"], registry=registry)
        self.up = Gauge("leakprobe_target_up", "1 when the target answered the last request, else 0.", ["target"],
                        registry=registry)
        self.runs = Counter("leakprobe_job_runs", "Job runs started.", target_job, registry=registry)
        self.failures = Counter("leakprobe_job_failures", "Job runs that did not complete, by reason.",
                                ["target", "job", "reason"], registry=registry)
        self.skips = Counter("leakprobe_job_skips", "Job runs not started, by reason (budget, locked).",
                             ["target", "job", "reason"], registry=registry)
        self.last_run = Gauge("leakprobe_last_run_timestamp_seconds", "When a job last ended.", target_job,
                              registry=registry)
        self.last_success = Gauge("leakprobe_last_success_timestamp_seconds", "When a job last completed.",
                                  target_job, registry=registry)
        self.interval = Gauge("leakprobe_job_interval_seconds", "How often a job is scheduled.", target_job,
                              registry=registry)
        self.canaries = Gauge("leakprobe_active_canaries", "Canaries this daemon scans answers for (every "
                              "replica's).", registry=registry)
        self.ledger_up = Gauge("leakprobe_ledger_up", "1 when the ledger took the last write, else 0.",
                               registry=registry)
        self.ledger_recoveries = Counter("leakprobe_ledger_recoveries", "Ledger files written back (deleted while "
                                         "open) or saved aside (replaced) from the copy the daemon held.",
                                         registry=registry)
        self.reload_ok = Gauge("leakprobe_config_last_reload_successful", "1 when the last config (re)load "
                               "succeeded.", registry=registry)
        self.reload_time = Gauge("leakprobe_config_last_reload_success_timestamp_seconds", "When the config was last "
                                 "loaded successfully.", registry=registry)
        self.reloads = Counter("leakprobe_config_reloads", "Config reloads attempted.", registry=registry)
        self.reload_failures = Counter("leakprobe_config_reload_failures", "Config reloads refused.",
                                       registry=registry)
        build = Gauge("leakprobe_build_info", "Always 1; labels say what runs.", ["version", "python"],
                      registry=registry)
        build.labels(__version__, platform.python_version()).set(1)
        self.incidents = IncidentCollector()
        registry.register(self.incidents)
        self._per_target: list[Counter | Gauge | Histogram] = [
            self.findings, self.probes, self.probe_duration, self.ttft, self.boundary, self.request_errors,
            self.tokens_sent, self.budget, self.budget_left, self.advertised, self.pool, self.input_limit, self.verdict,
            self.up, self.runs, self.failures, self.skips, self.last_run, self.last_success, self.interval]

    # -- what runs report -----------------------------------------------------------------------
    def listener(self, target: str, job: str) -> Listener:
        def on_event(event: Event) -> None:
            match event:
                case StepDone(result=result):
                    self._step(target, job, result)
                case FindingRecorded(finding=f):
                    self.findings.labels(target, f.kind.value, f.severity.label, f.victim_tenant or "",
                                         f.observer_tenant).inc()
                    self.incidents.record(f)
                case SurveyDone(result=result):
                    self.survey(target, result)
                case TargetFailed():
                    self.up.labels(target).set(0)
        return on_event

    def _step(self, target: str, job: str, result: StepResult) -> None:
        answer, step = result.answer, result.step
        self.probes.labels(target, job, step.boundary, result.outcome).inc()
        self.probe_duration.labels(target, job).observe(answer.total_s)
        if answer.ttft_s is not None:
            self.ttft.labels(target, job).observe(answer.ttft_s)
        self.tokens_sent.labels(target, step.tenant).inc(result.sent_tokens)
        self.up.labels(target).set(1 if answer.status is not None else 0)
        if result.outcome not in ("served", "refused"):
            self.request_errors.labels(target, result.outcome).inc()
        if step.role == "probe":
            self.boundary.labels(target, step.boundary).set(BoundaryOutcome.of(result))

    def survey(self, target: str, result: PreflightResult) -> None:
        capacity = result.capacity
        for gauge, known in ((self.advertised, capacity.advertised), (self.pool, capacity.pool_tokens),
                             (self.input_limit, capacity.max_req_input_len or capacity.accept_limit)):
            if known is not None:
                gauge.labels(target).set(known.value)
        held = {v.code for v in result.verdicts}
        for code, severity in VERDICTS.items():
            self.verdict.labels(target, code, severity.label).set(1 if code in held else 0)
        self.up.labels(target).set(0 if result.error and "cannot reach" in result.error else 1)

    # -- what jobs conclude ---------------------------------------------------------------------
    def schedule(self, target: str, job: str, interval: float, budget: int, tenants: Sequence[str]) -> None:
        """Series known in advance start at 0, so `increase()` and the rules see the first finding."""
        self.interval.labels(target, job).set(interval)
        self.budget.labels(target).set(budget)
        self.runs.labels(target, job)
        for reason in ("budget", "locked"):
            self.skips.labels(target, job, reason)
        for victim in tenants:
            for observer in tenants:
                if victim != observer:
                    for severity in ("critical", "high"):
                        self.findings.labels(target, "cross_tenant_echo", severity, victim, observer)

    def forget(self, targets: Iterable[str]) -> None:
        """Drop the series of targets a reload removed, so dashboards do not show them forever."""
        gone = set(targets)
        for metric in self._per_target:
            names = metric._labelnames  # the label order `remove` takes; client_python keeps it here
            seen = {tuple(sample.labels[n] for n in names) for family in metric.collect()
                    for sample in family.samples}
            for values in seen:
                if values[0] in gone:
                    metric.remove(*values)

    def set_incidents(self, incidents: Sequence[Incident], hold: float) -> None:
        self.incidents.replace(incidents)
        self.incidents.hold = hold
