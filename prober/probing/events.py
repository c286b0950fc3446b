"""What a run tells its observers while it runs: typed events, each sent after what it reports is durable.

The progress display of `leakprobe audit` and the daemon's metrics are two observers of the same events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prober.domain.types import Finding, Severity
from prober.probing.plan import Plan
from prober.probing.results import CheckResult, StepResult
from prober.probing.survey import Survey


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
class Observed:
    """A request a check judged in full (served, or refused where refusing is right), told by every check that can
    find anything, as it goes: what a clean answer re-checks of the incidents that check found
    (prober.domain.incidents).  The `observer`'s request at `boundary`, whose answer could have carried the data of
    `others` (None: any tenant's, itself included, as a request whose answer is scanned for every canary);
    `faulted`: its answer drew a finding above info, so what it lacks proves nothing of content; `counted`: the
    engine's failure counters were read around it as evidence.  Whether the check could see content at all is its
    result's, told with `CheckDone`."""

    check: str
    boundary: str
    observer: str
    others: tuple[str, ...] | None = None
    faulted: bool = False
    counted: bool = False

    @classmethod
    def of(cls, result: StepResult, check: str, others: tuple[str, ...] | None = None,
           counted: bool = False) -> Observed | None:
        """What one judged request observed (None where its answer shows nothing: no answer, or a refusal where the
        plan expected it served)."""
        if not result.observed:
            return None
        faulted = result.answer.served and any(f.severity > Severity.INFO for f in result.findings)
        return cls(check, result.step.boundary, result.step.tenant, others, faulted, counted)


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


Event = SurveyDone | PlanReady | StepDone | Observed | FindingRecorded | TargetFailed | CheckDone
Listener = Callable[[Event], None]


def ignore(event: Event) -> None:
    """The observer of a run nobody watches."""
