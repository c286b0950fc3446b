"""Every metric the daemon exports, in one place, on a registry passed in (never the process-global one).

Metrics are a view of results: `listener(target, job)` turns the runner's typed events into counts and
gauges as requests complete, and the jobs set what they conclude (capacity, verdicts, budget, last
success).  Nothing is probed on scrape: an exposition shows the last completed results.  Labels are
bounded (targets and tenants come from the config; kinds, outcomes and boundaries are fixed sets) and
never carry a canary id, an excerpt, a target's URL or a key (the only URLs are the links an operator
configured for pages: `leakprobe_links_info`).
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Sequence
from enum import IntEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from prober import __version__
from prober.checks import REGISTRY, Registry
from prober.config.sections import Links
from prober.daemon.incident_metrics import IncidentCollector
from prober.daemon.outcomes import Failure, Skip
from prober.daemon.spending import Spending
from prober.domain.incidents import Incident
from prober.probing.cache_map import LayerState
from prober.probing.results import CheckResult, StepResult
from prober.targets.result import Cut, ErrorKind
from prober.targets.transport import HTTPExchange

# Wide enough for a 1M-token prefill on real hardware (minutes) and a cached 100-token answer (ms).
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# What a request can fail with (a refusal is the engine's verdict, not an error).
REQUEST_ERRORS = tuple(kind for kind in ErrorKind if kind is not ErrorKind.REFUSED)
# No HTTP answer at all, or a gateway saying the engine behind it does not answer: the target is down.
DOWN_STATUSES = (None, 502, 503, 504)


class BoundaryOutcome(IntEnum):
    """Values of `leakprobe_boundary_last_outcome` (a state timeline maps them to words and colours)."""

    NO_ANSWER = 0  # timeout, connection, malformed, 5xx: the engine gave no verdict
    SERVED = 1  # served, as a correct engine does
    REFUSED = 2  # refused, as a correct engine does
    SERVED_OVER_LIMIT = 3  # served a prompt a correct engine must refuse (the incident's first symptom)
    REFUSED_UNDER_LIMIT = 4  # refused a prompt the capacity says fits

    @classmethod
    def of(cls, result: StepResult) -> BoundaryOutcome:
        answer, expected = result.answer, result.step.expect_served
        if answer.served:
            return cls.SERVED if expected else cls.SERVED_OVER_LIMIT
        if answer.refused:
            return cls.REFUSED_UNDER_LIMIT if expected else cls.REFUSED
        return cls.NO_ANSWER


class Metrics:
    def __init__(self, registry: CollectorRegistry, checks: Registry = REGISTRY) -> None:
        """`checks`: whose result series it exports (each check's `metrics`)."""
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
        self.request_errors = Counter("leakprobe_target_request_errors", "Requests to the target's API (every "
                                      "job's, surveys too) that failed, by error kind: connect, dns, tls, timeout, "
                                      "server_error, ...", ["target", "kind"], registry=registry)
        self.paused = Counter("leakprobe_rate_limit_pause_seconds", "Seconds requests to the target waited before "
                              "they were sent, because its answers said its rate limit was spent "
                              "(x-ratelimit-remaining-*: 0, until the reset they gave).", ["target"],
                              registry=registry)
        self.requests_cut = Counter("leakprobe_requests_cut", "Requests to the target (every job's, to any of its "
                                    "endpoints) ended while it was still on them, by reason: deadline (past the "
                                    "request's own, derived from its size), overlong (more than max_tokens allows, or "
                                    "max_body_bytes), keepalive (nothing but keep-alives), run_deadline (the job's).",
                                    ["target", "reason"], registry=registry)
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
        self.verdict = Gauge("leakprobe_capacity_verdict", "1 where the last survey that reached the target holds "
                             "this verdict, else 0 (its age: leakprobe_capacity_surveyed_timestamp_seconds).",
                             ["target", "verdict", "severity"], registry=registry)
        self.engine = Gauge("leakprobe_engine_info", "1 for the engine and release the last survey read (release: "
                            "as the engine says it, empty where it says none).", ["target", "engine", "release"],
                            registry=registry)
        self.known_bug = Gauge("leakprobe_engine_known_bug", "1 for each public isolation bug of leakprobe's bug table "
                               "for the target's engine, by how its release stands (applies, fixed, unknown).",
                               ["target", "bug", "standing"], registry=registry)
        self.engine_cache = Gauge("leakprobe_engine_cache_enabled", "1 where the engine says a cache of its own is "
                                  "on, 0 where it says it is off (layer: prefix, prefix-tier2), as the last survey "
                                  "read it; whether tenants share it is leakprobe_cache_layer_state.",
                                  ["target", "layer"], registry=registry)
        self.surveyed = Gauge("leakprobe_capacity_surveyed_timestamp_seconds", "When the capacity and verdicts were "
                              "last learned from the target (a survey that reached it).", ["target"], registry=registry)
        self.up = Gauge("leakprobe_target_up", "1 when the target's API gave an HTTP answer to the last request (of "
                        "any job), 0 when it got none (refused, DNS, TLS, timeout) or a gateway's 502/503/504.",
                        ["target"], registry=registry)
        self.runs = Counter("leakprobe_job_runs", "Job runs started.", target_job, registry=registry)
        self.on_demand = Counter("leakprobe_on_demand_runs", "Runs asked for through /probe, by what they came to "
                                 "(pass, fail, undecided); those refused: leakprobe_http_refused_total.",
                                 ["target", "job", "verdict"], registry=registry)
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
        self.process = ProcessMetrics(registry)
        self.checks = CheckMetrics(registry, checks)
        self.spending = Spending(registry)
        self.incidents = IncidentCollector()
        registry.register(self.incidents)
        self._per_target: list[MetricWrapperBase] = [
            self.findings, self.probes, self.probe_duration, self.ttft, self.boundary, self.request_errors,
            self.requests_cut, self.paused, self.tokens_sent, self.budget, self.budget_left, self.advertised, self.pool,
            self.input_limit, self.verdict, self.engine, self.known_bug, self.engine_cache, self.surveyed, self.up,
            self.runs, self.on_demand, self.failures, self.skips, self.last_run, self.last_success, self.interval,
            *self.checks.per_target, *self.spending.per_target]

    def exchanged(self, target: str, exchange: HTTPExchange, api: bool) -> None:
        """Every request sent to the target, whichever job sent it: those cut short, and from its API's its health
        (but for one its job's deadline cut: that says nothing of the target)."""
        error = exchange.error
        if exchange.paused_s:
            self.paused.labels(target).inc(exchange.paused_s)
        if error is not None and error.cut is not None:
            self.requests_cut.labels(target, error.cut).inc()
        if not api or (error is not None and error.cut is Cut.RUN_DEADLINE):
            return
        if error is not None and error.kind is not ErrorKind.REFUSED:
            self.request_errors.labels(target, error.kind).inc()
        elif exchange.status in (401, 403):
            self.request_errors.labels(target, ErrorKind.UNAUTHORIZED).inc()
        self.up.labels(target).set(0 if exchange.status in DOWN_STATUSES else 1)

    def missed(self, target: str, job: str, skip: str) -> None:
        """The scheduler skipped a slot (busy, missed): counted, not logged (it is routine under load)."""
        self.skips.labels(target, job, skip).inc()

    # -- what jobs conclude ---------------------------------------------------------------------
    def schedule(self, target: str, job: str, interval: float, budget: int, tenants: Sequence[str]) -> None:
        """Series known in advance start at 0, so `increase()` and the rules see the first event."""
        self.interval.labels(target, job).set(interval)
        self.process.start_lag.labels(job)
        self.budget.labels(target).set(budget)
        self.spending.sent.labels(target, job)
        self.runs.labels(target, job)
        for failure in Failure:
            self.failures.labels(target, job, failure)
        for skip in Skip:
            self.skips.labels(target, job, skip)
        for kind in REQUEST_ERRORS:
            self.request_errors.labels(target, kind)
        for cut in Cut:
            self.requests_cut.labels(target, cut)
        self.paused.labels(target)
        for tenant in tenants:
            self.tokens_sent.labels(target, tenant)
        for victim in tenants:
            for observer in tenants:
                if victim != observer:
                    for severity in ("critical", "high"):
                        self.findings.labels(target, "cross_tenant_echo", severity, victim, observer)

    def forget(self, targets: Iterable[str]) -> None:
        """Drop the series of targets a reload removed, so dashboards do not show them forever."""
        for target in set(targets):
            for metric in self._per_target:
                metric.remove_by_labels({"target": target})

    def set_incidents(self, incidents: Sequence[Incident], hold: float, notice: float) -> None:
        self.incidents.replace(incidents, hold, notice)


class ProcessMetrics:
    """What the daemon process says of itself rather than of a target: its canaries, its ledger, its config's
    reloads, refused requests to its endpoints, its build and the links its pages carry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.canaries = Gauge("leakprobe_active_canaries", "Canaries this daemon scans answers for: every replica's "
                              "not yet past retention, and those this process minted since.", registry=registry)
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
        self.http_refused = Counter("leakprobe_http_refused", "Requests to /status, /-/reload or /probe refused: 401 "
                                    "without the token, 403 off (or /probe from another host without a token), 404 "
                                    "no such target or check, 429 busy, too soon or over budget.",
                                    ["endpoint", "status"], registry=registry)
        for endpoint, status in (("status", "401"), ("reload", "401"), ("reload", "403")):
            self.http_refused.labels(endpoint, status)
        self.start_lag = Histogram("leakprobe_job_start_lag_seconds", "How late each run was handed to the daemon "
                                   "after it was due (its jitter included in when it was due): a blocked event "
                                   "loop, or more jobs than the process keeps up with.", ["job"],
                                   buckets=LAG_BUCKETS, registry=registry)
        build = Gauge("leakprobe_build_info", "Always 1; labels say what runs.", ["version", "python"],
                      registry=registry)
        build.labels(__version__, platform.python_version()).set(1)
        self.links = Gauge("leakprobe_links_info", "Always 1; labels are where a page links to (daemon.links): "
                           "the Grafana base URL and this daemon's /status.", ["grafana", "status"], registry=registry)

    def reloaded(self, at: float | None, *, attempt: bool = True) -> None:
        """A config (re)load that took effect (`at`: when it was loaded) or was refused (None)."""
        if attempt:
            self.reloads.inc()
        if at is None:
            self.reload_failures.inc()
        else:
            self.reload_time.set(at)
        self.reload_ok.set(0 if at is None else 1)

    def set_links(self, links: Links) -> None:
        self.links.clear()
        self.links.labels(links.grafana or "", links.status or "").set(1)


class CheckMetrics:
    """What the checks decide beyond their requests: each job's sight, the cache map (each layer any check tested),
    and the series each check's results carry (its own `ResultMetrics`, from the registry of checks)."""

    def __init__(self, registry: CollectorRegistry, checks: Registry) -> None:
        self.blind = Gauge("leakprobe_probes_blind", "1 when the job's last run got answers and none repeated its own "
                           "tenant's canary: its content checks could not have seen a leak; 0 when some did.",
                           ["target", "job"], registry=registry)
        self.cache_layer = Gauge("leakprobe_cache_layer_state", "Per cache layer and route of a target, what its last "
                                 "test found: 1 on its state (shared, per_tenant, none_seen, undecided), 0 on the "
                                 "others.",
                                 ["target", "layer", "route", "state"], registry=registry)
        self.results = {check.name: observer for check in checks if (observer := check.metrics(registry))}
        self.per_target: list[MetricWrapperBase] = [
            self.blind, self.cache_layer, *(series for observer in self.results.values() for series in observer.series)]

    def observe(self, target: str, result: CheckResult) -> None:
        """A check's run ended on `target` (the `shapes` check's too, where another check chose the shape first)."""
        for layer in result.layers:
            for state in LayerState:
                self.cache_layer.labels(target, layer.layer, layer.route, state.value).set(float(state is layer.state))
        observer = self.results.get(result.check)
        if observer is not None:
            observer.observe(target, result)
