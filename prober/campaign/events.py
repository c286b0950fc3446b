"""What a run tells its observers while it runs: typed events, each sent after what it reports is durable.

The progress display of `leakprobe audit` and the daemon's metrics are two observers of the same events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prober.campaign.plan import Plan
from prober.campaign.results import CheckResult, StepResult
from prober.campaign.survey import Survey
from prober.domain.types import Finding


@dataclass(frozen=True)
class SurveyDone:
    result: Survey


@dataclass(frozen=True)
class PlanReady:
    plan: Plan


@dataclass(frozen=True)
class StepDone:
    result: StepResult


@dataclass(frozen=True)
class FindingRecorded:
    """Sent only once the finding is in the ledger."""

    finding: Finding


@dataclass(frozen=True)
class TargetFailed:
    target: str
    message: str


@dataclass(frozen=True)
class CheckDone:
    """A check's run on a target ended (after its findings were recorded): what it concluded, whatever the check
    (its result says; a check's own results extend `CheckResult`)."""

    target: str
    result: CheckResult


Event = SurveyDone | PlanReady | StepDone | FindingRecorded | TargetFailed | CheckDone
Listener = Callable[[Event], None]


def ignore(event: Event) -> None:
    """The observer of a run nobody watches."""
