"""What one run of a daemon job came to: why it failed, why it did not start, and what it sent and saw -- the
values the scheduler, the records, the metrics and `/status` share."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Failure(StrEnum):
    """Why a job that started did not complete (`leakprobe_job_failures_total{reason}`)."""

    UNUSABLE = "unusable"  # the target cannot be probed: unreachable, a credential refused
    PLAN = "plan"  # no plan fits what the survey learned
    PROMPT = "prompt"  # prompts could not be built to length
    LEDGER = "ledger"  # a canary or finding could not be recorded
    INCOMPLETE = "incomplete"  # some answers could not be observed
    DEADLINE = "deadline"  # the job's deadline passed before it finished


class Skip(StrEnum):
    """Why a scheduled job did not start (`leakprobe_job_skips_total{reason}`); nothing was sent."""

    BUDGET = "budget"  # the plan does not fit today's token budget
    BUSY = "busy"  # its previous run is still going
    MISSED = "missed"  # the scheduler woke too late for the slot
    LEDGER = "ledger"  # the ledger does not take writes: nothing may be sent
    LOCKED = "locked"  # another replica is running it
    CLAIMED = "claimed"  # another replica ran it in this slot

    @property
    def turn_taken(self) -> bool:
        """Another replica has the job: how replicas cooperate, not a problem."""
        return self in (Skip.LOCKED, Skip.CLAIMED)


@dataclass(frozen=True)
class JobOutcome:
    failure: Failure | None = None
    skip: Skip | None = None
    message: str = ""
    tokens: int = 0
    blind: bool | None = None  # answers came back and none carried its own canary (None: not a content check)
    # Prompt tokens each job's plan holds, as this run learned it: a check's own; the preflight's, every scheduled
    # check's from its survey (what the day's projection against the budget is made of).
    plans: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None and self.skip is None
