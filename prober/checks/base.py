"""The check contract: a name, what a run costs on a target, and the run itself.

A check is one way a target can be caught leaking (the boundary campaign, the prefix cache, timing, cross-talk, idle
slots, the probe shape that makes the rest see, the everyday sentinel).  It plans for a target from what the survey
learned (`planned`: the tokens it will send and how long that may take at the floors every request's deadline
assumes), then runs against the target's context (`run`: send as a tenant, plant, judge) and returns a
`CheckResult`.  The audit, the daemon's jobs and schedule, the budget and deadlines, the report's coverage and sight,
the progress lines and the metrics all loop over the registry (prober/checks/registry.py) and read results through
the base class: a new check is one module and one registry line.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from pydantic import BaseModel

from prober.checks.bugs import EngineBug
from prober.config.schema import ProberConfig
from prober.domain.errors import PlanError
from prober.domain.evidence import Tagged
from prober.probing.context import TargetContext
from prober.probing.events import CheckDone, Listener
from prober.probing.plan import Planned
from prober.probing.results import CheckResult

SURVEY_ALLOWANCE_S = 300.0  # reachability, introspection, finding a tokenizer: before any check can plan
DEADLINE_BASE_S = 120.0  # what a run adds once, beyond its checks' requests at the floors


@dataclass(frozen=True)
class Run:
    """One run of checks against one target: its context, the whole config (each check reads its own section),
    the run's id (in every canary and request id, so repeated runs never reuse one), and who listens."""

    target: TargetContext
    config: ProberConfig
    run_id: str = ""
    on_event: Listener = lambda _: None


class Check(ABC):
    name: ClassVar[str]  # its job in the daemon, its label in metrics and reports
    about: ClassVar[str]  # one line: what it catches (the docs, the config reference)
    every: ClassVar[float | None]  # the daemon's default interval, seconds (None: only where `daemon.schedule` says)
    survey: ClassVar[bool] = False  # the daemon surveys the target afresh before each run (not only the first)
    sees_with: ClassVar[str] = ""  # checks of one group build their probes alike: one's echo vouches for the others
    docs: ClassVar[str] = "auditing.md"  # the page of docs/ whose section `{#name}` says what it does and costs
    evidence: ClassVar[tuple[type[Tagged], ...]] = ()  # the evidence types it brings (the codec reads them back)
    settings: ClassVar[type[BaseModel] | None] = None  # its own config section, keyed by its name (`section`)
    bugs: ClassVar[tuple[EngineBug, ...]] = ()  # the public engine bugs it catches: its rows of the bug table

    def in_audit(self, config: ProberConfig) -> bool:
        """Whether `leakprobe audit` runs it: its own section's `audit` where it brings one that has it, else yes (the
        sentinel is the daemon's alone)."""
        own = config.section(self.name, self.settings) if self.settings is not None else None
        return bool(getattr(own, "audit", True))

    def metrics(self, registry: CollectorRegistry) -> ResultMetrics | None:
        """The series its results carry beyond their requests, on the daemon's registry (None: none)."""
        return None

    @abstractmethod
    def planned(self, run: Run) -> Planned:
        """What a run will send, from the survey (raises PlanError where nothing can be planned)."""

    @abstractmethod
    async def run(self, run: Run, planned: Planned) -> CheckResult:
        """Send, judge, record: every finding durable before it is told, the result's errors saying what could not
        be observed."""


class ResultMetrics(ABC):
    """What a check decides beyond its requests, as metrics: each run's result observed as it ends.  Every series is
    labelled by `target`, so that a target a reload removes leaves none behind."""

    series: list[MetricWrapperBase]

    @abstractmethod
    def observe(self, target: str, result: CheckResult) -> None:
        """Its run on `target` ended with `result` (its own check's)."""


def planning(check: Check, run: Run) -> Planned:
    """What a check will send, or why it could not be planned: one check that cannot plan (its prompts sized by a
    capacity nobody gave) never keeps the others of the run from theirs."""
    try:
        return check.planned(run)
    except PlanError as exc:
        return Planned.unplanned_because(str(exc))


async def perform(check: Check, run: Run, planned: Planned) -> CheckResult:
    """A check's run, or where it is moot on this target, or could not be planned, a result that says why (it sent
    nothing; not planned is an error, so the run is incomplete)."""
    if planned.moot is None and planned.unplanned is None:
        result = await check.run(run, planned)
    else:
        result = CheckResult(check=check.name, moot=planned.moot,
                             errors=[f"{check.name}: {planned.unplanned}"] if planned.unplanned else [])
    run.on_event(CheckDone(run.target.config.name, result))
    return result
