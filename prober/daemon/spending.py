"""What the daemon spends of each target's day: prompt tokens by job, what each job's last plan holds, and the day
those plans add up to at their intervals, against the budget.  `Pacing` keeps the plans and intervals; this module
is the arithmetic and the series that show it."""

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

    @classmethod
    def of(cls, target: str, budget: int, plans: Mapping[str, int],
           intervals: Mapping[str, float]) -> Projection | None:
        """The day of the scheduled jobs that have a plan (None: none has yet)."""
        by_job = {job: round(tokens * DAY_S / intervals[job]) for job, tokens in plans.items() if job in intervals}
        return cls(target, sum(by_job.values()), budget, by_job) if by_job else None

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

    def show(self, projection: Projection, plans: Mapping[str, int]) -> None:
        for job in projection.by_job:
            self.planned.labels(projection.target, job).set(plans[job])
        self.projected.labels(projection.target).set(projection.tokens)
