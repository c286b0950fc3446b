"""What a run tells its observers while it runs: typed events, each sent after what it reports is durable.

The progress display of `leakprobe audit` and the daemon's metrics are two observers of the same events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prober.campaign.crosstalk import CrosstalkResult
from prober.campaign.plan import Plan
from prober.campaign.results import ShapeChoice, StepResult
from prober.campaign.survey import PreflightResult
from prober.campaign.timing import TimingResult
from prober.types import Finding


@dataclass(frozen=True)
class SurveyDone:
    result: PreflightResult


@dataclass(frozen=True)
class PlanReady:
    plan: Plan


@dataclass(frozen=True)
class ShapeChosen:
    """The probe shape a target's requests take from now on, and what each shape tried brought back."""

    target: str
    choice: ShapeChoice


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
class TimingDone:
    """The timing check decided every pair (after its findings were recorded)."""

    result: TimingResult


@dataclass(frozen=True)
class BurstDone:
    """The cross-talk burst was checked (after its findings were recorded)."""

    result: CrosstalkResult


Event = SurveyDone | PlanReady | ShapeChosen | StepDone | FindingRecorded | TargetFailed | TimingDone | BurstDone
Listener = Callable[[Event], None]


def ignore(event: Event) -> None:
    """The observer of a run nobody watches."""
