"""What running plans produced: per request, per target, per audit.  Reports and metrics are views of these."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from prober.campaign.crosstalk import CrosstalkResult
from prober.campaign.path import PathOverhead
from prober.campaign.plan import Plan, Step
from prober.campaign.survey import PreflightResult
from prober.campaign.timing import TimingResult
from prober.incidents import Incident, group
from prober.prompts.shape import Shape
from prober.targets.result import Completion, ErrorKind
from prober.types import Finding, Severity


class Outcome(StrEnum):
    """How a request ended, when not with one of the transport's error kinds (`ErrorKind`)."""

    SERVED = "served"
    REFUSED = "refused"
    UNKNOWN = "unknown"


OUTCOME_WORDS = {"refused": "refused at lengths the capacity says fit",
                 "server_error": "failed (5xx) at lengths the capacity says fit"}
HINTS = {"refused": "check the model name, the gateway in front of the engine and the credentials",
         "unauthorized": "check the tenants' credentials",
         "rate_limited": "lower the request rate or raise the quota",
         "timeout": "the target is too slow, stalls or never finishes its answers: see timeout_s, deadline_s and the "
                    "audit deadline",
         "server_error": "the engine fails: see its logs",
         "connect": "check the URL and the network path",
         "malformed": "the target does not answer as its API promises",
         "truncated": "the target cuts its answers off"}


@dataclass(kw_only=True)
class StepResult:
    step: Step
    exchange: str
    target: str
    sent_tokens: int
    counted: bool
    answer: Completion
    canary_ids: list[str]
    findings: list[Finding]
    own_echoes: int = 0

    @property
    def token_error(self) -> int | None:
        """usage.prompt_tokens minus what was sent: how well the engine's count matched ours."""
        usage = self.answer.usage.prompt_tokens if self.answer.usage else None
        return None if usage is None or not self.answer.served else usage - self.sent_tokens

    @property
    def outcome(self) -> Outcome | ErrorKind:
        """Served, refused, or the error kind (timeout, connect, server_error, ...)."""
        if self.answer.served:
            return Outcome.SERVED
        if self.answer.refused:
            return Outcome.REFUSED
        return self.answer.error.kind if self.answer.error else Outcome.UNKNOWN

    @property
    def observed(self) -> bool:
        """Whether this request shows how the engine isolates tenants.  Served: its answer was checked.
        Refused, or failed with the engine's own 5xx, where the plan expects a refusal (above the acceptance
        limit): that is the engine's verdict on an over-limit prompt.  Anything else is not an observation:
        no usable answer (timeout, connect, malformed, truncated, too large, unauthorized, rate limited), and
        a refusal or a 5xx at a length the capacity says fits — the boundary it was sent to test went
        untested."""
        answer = self.answer
        if answer.served:
            return True
        if self.step.expect_served or answer.error is None:
            return False
        return answer.refused or (answer.error.kind is ErrorKind.SERVER_ERROR and answer.status is not None)


@dataclass
class ShapeTrial:
    shape: Shape
    controls: list[StepResult] = field(default_factory=list)
    error: str | None = None  # the shape could not be tried (no tokenizer for its route, say)

    @property
    def echoed(self) -> int:
        return sum(1 for c in self.controls if c.own_echoes)

    @property
    def served(self) -> int:
        return sum(1 for c in self.controls if c.answer.served)

    def to_json(self) -> dict[str, object]:
        return {"shape": self.shape.name, "sent": len(self.controls), "served": self.served, "echoed": self.echoed,
                "error": self.error}


@dataclass
class ShapeChoice:
    chosen: Shape
    trials: list[ShapeTrial]

    @property
    def blind(self) -> bool:
        """No control in any shape brought its own canary back."""
        return not any(t.echoed for t in self.trials)

    def summary(self) -> str:
        tried = ", ".join(f"{t.shape.name} {t.echoed}/{len(t.controls)}" if t.error is None
                          else f"{t.shape.name} ({t.error})" for t in self.trials)
        return f"{self.chosen.name}{' (blind)' if self.blind else ''}; own canary back: {tried}"

    def to_json(self) -> dict[str, object]:
        return {"chosen": self.chosen.name, "blind": self.blind, "summary": self.summary(),
                "trials": [t.to_json() for t in self.trials]}


@dataclass
class SlotCheck:
    width: int
    steps: list[StepResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return [f for s in self.steps for f in s.findings]

    @property
    def tokens(self) -> int:
        return sum(s.sent_tokens for s in self.steps)

    def to_json(self) -> dict[str, object]:
        return {"width": self.width, "requests": len(self.steps), "findings": len(self.findings),
                "errors": self.errors}


@dataclass
class TargetReport:
    name: str
    url: str
    survey: PreflightResult | None = None  # capacity, verdicts, tokenizer: learned before the first prompt
    plan: Plan | None = None
    steps: list[StepResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    complete: bool = False
    timing: TimingResult | None = None  # the timing check of prefix-cache isolation, where it ran
    crosstalk: CrosstalkResult | None = None  # the cross-talk burst, where it ran
    shape: ShapeChoice | None = None  # the probe shape this run measured and took, where it chose one
    slots: SlotCheck | None = None  # the idle-slot check, where it ran
    paths: list[PathOverhead] = field(default_factory=list)  # what the path to the engine adds, per route used
    skipped: dict[str, str] = field(default_factory=dict)  # exchange id -> why it could not be built (not sent)
    notes: list[str] = field(default_factory=list)  # what the run set aside and why (no error: it still completed)

    @property
    def findings(self) -> list[Finding]:
        extra = [f for check in (self.timing, self.crosstalk, self.slots) if check for f in check.findings]
        return [f for s in self.steps for f in s.findings] + extra

    @property
    def tokens_sent(self) -> int:
        checks = (self.timing, self.crosstalk, self.slots)
        return sum(s.sent_tokens for s in self.steps) + sum(c.tokens for c in checks if c)

    @property
    def sights(self) -> dict[str, Sight]:
        """Per content check that got answers: how many of its probes' answers carried their own tenant's canary.
        Probes only: a probe-shape control is picked to echo, and the burst's "repeat the code word" echoes where
        a quote of a long document would not, so neither vouches for the boundaries (the burst vouches for itself)."""
        probes = {"boundaries": [s for s in self.steps if s.step.role == "probe" and s.answer.served],
                  "idle slots": [s for s in self.slots.steps if s.step.role == "probe" and s.answer.served]
                  if self.slots else []}
        sights = {name: Sight(len(answers), sum(1 for s in answers if s.own_echoes))
                  for name, answers in probes.items() if answers}
        if self.crosstalk and self.crosstalk.answered:
            sights["cross-talk"] = Sight(self.crosstalk.answered, self.crosstalk.own_echoed)
        return sights

    @property
    def blind(self) -> list[str]:
        """The content checks that got answers and could not see: none of them carried its own canary."""
        return [name for name, sight in self.sights.items() if sight.blind]

    def coverage(self) -> Coverage:
        """Of the plan's requests: the probe shape's controls say which shape to use, not what the engine does; an
        exchange that cannot be built behind the path (a one-page prime behind a longer system prompt) is not
        planned for this target."""
        steps = [s for s in self.steps if s.step.role != "control"]
        planned = (sum(len(e.steps) for e in self.plan.exchanges if e.id not in self.skipped) if self.plan
                   else len(steps))
        return Coverage(planned, len(steps), Counter(s.outcome for s in steps if not s.observed))


@dataclass(frozen=True)
class Sight:
    """Whether content checks could see: an answer that repeats its own canary shows that a canary in the
    model's context comes out in its answer, so another tenant's would too.  With none, a clean scan means
    nothing."""

    checked: int
    echoed: int

    @property
    def blind(self) -> bool:
        return self.checked > 0 and self.echoed == 0

    def reason(self, check: str) -> str:
        return (f"{check} blind: none of {self.checked} probe answers repeated its own tenant's canary, so another "
                "tenant's would not have shown either")

    def to_json(self) -> dict[str, object]:
        return {"checked": self.checked, "echoed": self.echoed, "blind": self.blind}


@dataclass(frozen=True)
class Coverage:
    """Of the requests a target's plan holds: how many were sent, and the unobserved ones by outcome."""

    planned: int
    sent: int
    unobserved: Counter[str]

    @property
    def observed(self) -> int:
        return self.sent - sum(self.unobserved.values())

    def reason(self) -> str | None:
        """Why these requests do not support "no leak", in one line; None when every planned request was sent
        and observed."""
        if self.observed == self.planned:
            return None
        parts = [f"{n} {OUTCOME_WORDS.get(outcome, outcome)}" for outcome, n in self.unobserved.most_common()]
        if self.sent < self.planned:
            parts.append(f"{self.planned - self.sent} not sent")
        hints = [HINTS[o] for o, _ in self.unobserved.most_common() if o in HINTS][:2]
        return (f"{self.observed} of {self.planned} planned requests observed ({', '.join(parts)})"
                + (f": {'; '.join(hints)}" if hints else ""))

    def to_json(self) -> dict[str, object]:
        return {"planned": self.planned, "sent": self.sent, "observed": self.observed,
                "unobserved": dict(self.unobserved)}


@dataclass
class AuditResult:
    targets: list[TargetReport] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    finished: float = 0.0
    dry_run: bool = False

    @property
    def findings(self) -> list[Finding]:
        return [f for t in self.targets for f in t.findings]

    @property
    def incidents(self) -> list[Incident]:
        return group(self.findings)

    @property
    def complete(self) -> bool:
        return all(t.complete for t in self.targets)

    @property
    def blind(self) -> bool:
        """Some content check of some target got answers and none repeated its own canary: it could not see."""
        return any(t.blind for t in self.targets)

    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)
