"""What the daemon spends of each target's day: prompt tokens by job, what each job's last plan holds, and the day
those plans add up to at the schedule, against the budget.  A schedule that cannot fit skips jobs for budget every
day (`leakprobe_job_skips_total{reason="budget"}`); the projection says so before the day runs out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

DAY_S = 86_400.0


@dataclass(frozen=True)
class Projection:
    """Prompt tokens a day the schedule sends one target at its jobs' last plans, against its daily budget."""

    target: str
    tokens: int
    budget: int
    by_job: Mapping[str, int]  # each job's plan times its runs a day

    @property
    def fits(self) -> bool:
        return self.tokens <= self.budget

    def describe(self) -> str:
        jobs = ", ".join(f"{job} {tokens:,}" for job, tokens in sorted(self.by_job.items(), key=lambda j: -j[1])
                         if tokens)
        return (f"{self.target}: the schedule plans {self.tokens:,} prompt tokens a day ({jobs}), over "
                f"daemon.tokens_per_day ({self.budget:,}): jobs will be skipped for budget; raise the budget or "
                "lengthen the longest job's interval (daemon.schedule)")


class Spending:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.sent = Counter("leakprobe_job_tokens_sent", "Prompt tokens sent by each job's runs.",
                            ["target", "job"], registry=registry)
        self.planned = Gauge("leakprobe_job_planned_tokens", "Prompt tokens the job's last plan holds: what one run "
                             "reserves of the day's budget (the preflight plans every scheduled check from its "
                             "survey).", ["target", "job"], registry=registry)
        self.projected = Gauge("leakprobe_token_budget_projected_tokens", "Prompt tokens a day the schedule sends "
                               "at the jobs' last plans (each plan times its runs a day); over "
                               "leakprobe_token_budget_tokens, jobs are skipped for budget.", ["target"],
                               registry=registry)
        self.per_target = [self.sent, self.planned, self.projected]
        self._intervals: dict[tuple[str, str], float] = {}
        self._budgets: dict[str, int] = {}
        self._plans: dict[tuple[str, str], int] = {}

    def schedule(self, target: str, job: str, interval: float, budget: int) -> None:
        self._intervals[(target, job)] = interval
        self._budgets[target] = budget
        self.sent.labels(target, job)

    def plans(self, target: str, plans: Mapping[str, int]) -> Projection | None:
        """A run's plans taken in; the target's day projected anew (None until some job of it has a plan)."""
        for job, tokens in plans.items():
            if (target, job) in self._intervals:
                self._plans[(target, job)] = tokens
                self.planned.labels(target, job).set(tokens)
        by_job = {job: round(tokens * DAY_S / self._intervals[(t, job)])
                  for (t, job), tokens in self._plans.items() if t == target}
        if not by_job:
            return None
        projection = Projection(target, sum(by_job.values()), self._budgets[target], by_job)
        self.projected.labels(target).set(projection.tokens)
        return projection

    def forget(self, target: str) -> None:
        self._intervals = {k: v for k, v in self._intervals.items() if k[0] != target}
        self._plans = {k: v for k, v in self._plans.items() if k[0] != target}
        self._budgets.pop(target, None)
