"""What running checks produced, per request, check, target and audit: reports, metrics and progress view it."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from prober.domain.errors import BuildError
from prober.domain.incidents import Incident, group
from prober.domain.types import Finding, FindingKind, Severity
from prober.probing.cache_map import CacheVerdict
from prober.probing.coverage import Coverage
from prober.probing.documents import CheckDoc, ShapeDoc, SightDoc, TrialDoc
from prober.probing.path import PathOverhead, behind_path
from prober.probing.plan import Plan, Planned, Step
from prober.probing.survey import Survey
from prober.prompts.shape import Shape
from prober.targets.result import Completion, ErrorKind


class Outcome(StrEnum):
    """How a request ended, when not with one of the transport's error kinds (`ErrorKind`)."""

    SERVED = "served"
    REFUSED = "refused"
    UNKNOWN = "unknown"


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
    def echoed(self) -> bool:
        """Its answer repeated a canary its model was given: its own (the positive control), or another tenant's (a
        leak, which shows as much that a canary in the context comes out in the answer).  Its check could see."""
        return bool(self.own_echoes) or any(f.kind is FindingKind.CROSS_TENANT_ECHO for f in self.findings)

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
    def undecided(self) -> bool:
        """Served or refused at a length the path's varying prefix leaves undecided."""
        return any(f.kind is FindingKind.PATH_JITTER for f in self.findings)

    @property
    def observed(self) -> bool:
        """Whether this request shows how the engine isolates tenants.  Served: its answer was checked.  Refused, or
        failed with the engine's own 5xx, where the plan expects a refusal (over the acceptance limit): the engine's
        verdict on an over-limit prompt.  Not: no usable answer (timeout, connect, malformed, truncated, too large,
        unauthorized, rate limited), or a refusal or a 5xx at a length the capacity says fits (its boundary went
        untested) unless a varying path may have put it over the limit (`path_jitter`: either verdict is right)."""
        answer = self.answer
        if answer.served:
            return True
        if answer.error is None or (self.step.expect_served and not self.undecided):
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

    def to_json(self) -> TrialDoc:
        return {"shape": self.shape.name, "sent": len(self.controls), "served": self.served, "echoed": self.echoed,
                "error": self.error}


@dataclass
class ShapeChoice:
    chosen: Shape
    trials: list[ShapeTrial]
    run_id: str = ""  # the run that chose it

    @property
    def faulted(self) -> bool:
        """A control drew a finding above info: the choice was made on a target at fault."""
        return any(f.severity > Severity.INFO for t in self.trials for c in t.controls for f in c.findings)

    @property
    def blind(self) -> bool:
        """No control in any shape brought its own canary back."""
        return not any(t.echoed for t in self.trials)

    def summary(self) -> str:
        tried = ", ".join(f"{t.shape.name} {t.echoed}/{len(t.controls)}" if t.error is None
                          else f"{t.shape.name} ({t.error})" for t in self.trials)
        return f"{self.chosen.name}{' (blind)' if self.blind else ''}; own canary back: {tried}"

    def to_json(self) -> ShapeDoc:
        return {"chosen": self.chosen.name, "blind": self.blind, "summary": self.summary(),
                "trials": [t.to_json() for t in self.trials]}


@dataclass(kw_only=True)
class CheckResult:
    """What one run of one check produced: the requests it judged one by one (`steps`), what it found besides them
    (a decision over many requests), what it could not do, and the coverage it owes.  Every check's result is this
    or extends it (prober/checks), so reports, metrics and progress read any check alike."""

    check: str
    steps: list[StepResult] = field(default_factory=list)
    extra: list[Finding] = field(default_factory=list)  # findings beside its steps'
    errors: list[str] = field(default_factory=list)  # what it could not do: the run is incomplete
    notes: list[str] = field(default_factory=list)  # what it set aside, and why (it still completed)
    planned: int = 0  # requests its plan holds, where it runs a plan: what coverage is counted against
    skipped: dict[str, str] = field(default_factory=dict)  # exchange id -> why it could not be built (not planned)
    other_tokens: int = 0  # prompt tokens sent beside its steps (a timing pair's, a burst's)
    content: bool = True  # it reads answers for canaries: its probes' answers are its sight
    sees_with: str = ""  # checks whose probes are built alike vouch for each other's sight (a plan's exchanges)
    stopped: str | None = None  # why it stopped early (a deadline, the circuit breaker): no check after it runs
    moot: str | None = None  # why it had nothing to check on this target, and sent nothing
    layers: list[CacheVerdict] = field(default_factory=list)  # the caches it tested, each with its state: the map

    @property
    def findings(self) -> list[Finding]:
        return [f for s in self.steps for f in s.findings] + self.extra

    @property
    def tokens(self) -> int:
        return sum(s.sent_tokens for s in self.steps) + self.other_tokens

    def skip(self, exchange: str, why: BuildError, paths: Sequence[PathOverhead], tenants: Sequence[str]) -> None:
        """An exchange whose prompt cannot be built behind the path (a prime that cannot fit under the limit behind a
        long operator prompt): not sent and said, not planned.  Raises `why` where the path is not the reason."""
        behind = behind_path(paths, tenants)
        if behind is None:
            raise why
        self.skipped[exchange] = f"{why}, {behind}"

    def none_built(self, exchanges: int) -> None:
        """Where every one of its `exchanges` was skipped, it tested nothing: an error, so that the verdict never
        reads clean for it."""
        if exchanges and len(self.skipped) >= exchanges:
            self.errors.append(f"{self.check}: none of its {exchanges} exchanges could be built: "
                               f"{next(iter(self.skipped.values()))}")

    @property
    def requests(self) -> int:
        """Requests it sent (a check that judges many at once, not as steps, says how many)."""
        return len(self.steps)

    @property
    def sight(self) -> Sight | None:
        """Of its probes' answers that came back, how many repeated a canary: their own tenant's, or another's (None:
        it reads no content, or no probe was answered)."""
        probes = [s for s in self.steps if s.step.role == "probe" and s.answer.served]
        return Sight(len(probes), sum(1 for s in probes if s.echoed)) if self.content and probes else None

    @property
    def sighted(self) -> bool:
        """Some answer of its repeated its own canary, so that a clean one would have shown another tenant's: its
        clean answers re-check what only content shows (prober.domain.incidents)."""
        sight = self.sight
        return sight is not None and sight.echoed > 0

    def coverage(self) -> Coverage:
        """Of the requests its plan holds (a probe-shape control says which shape to use, not what the engine
        does)."""
        steps = [s for s in self.steps if s.step.role != "control"]
        return Coverage(self.planned, len(steps), Counter(s.outcome for s in steps if not s.observed))

    def summary(self) -> str:
        """One line for progress and logs."""
        if self.moot is not None:
            return f"not run: {self.moot}"
        return f"{len(self.steps)} requests, {len(self.findings)} findings" + (
            f", {len(self.errors)} errors" if self.errors else "")

    def still_checked(self) -> str | None:
        """What it observed without reading answers for canaries, where a blind verdict lists it."""
        probes = [s for s in self.steps if s.step.role == "probe" and s.observed]
        return f"{self.check} ({len(probes)} probes: refusals, usage, finish reasons)" if probes else None

    def to_json(self) -> CheckDoc:
        sight = self.sight
        return {"check": self.check, "requests": self.requests, "tokens": self.tokens,
                "findings": len(self.findings), "sight": sight.to_json() if sight else None,
                "errors": self.errors, "notes": self.notes, "skipped": self.skipped, "moot": self.moot,
                "summary": self.summary()}


@dataclass(kw_only=True)
class ShapeResult(CheckResult):
    """The probe-shape choice (prober/checks/shapes.py): its controls are its steps."""

    choice: ShapeChoice | None = None
    content: bool = False  # its controls are picked for echoing: they vouch for no check

    @property
    def sighted(self) -> bool:
        """Its controls vouch for no other check, but for its own answers they do."""
        return self.choice is not None and not self.choice.blind

    def summary(self) -> str:
        return self.choice.summary() if self.choice else "no probe shape could be tried"

    def still_checked(self) -> str | None:
        return None


@dataclass
class TargetReport:
    name: str
    url: str
    survey: Survey | None = None  # capacity, verdicts, tokenizer: learned before the first prompt
    results: list[CheckResult] = field(default_factory=list)  # one per check run, in order
    planned: dict[str, Planned] = field(default_factory=dict)  # what each check was to send, by check
    paths: list[PathOverhead] = field(default_factory=list)  # what the path to the engine adds, per route used
    errors: list[str] = field(default_factory=list)
    complete: bool = False
    price_per_mtok: float | None = None  # what the target bills per million prompt tokens, where the config says

    def result(self, check: str) -> CheckResult | None:
        """What the named check returned, where it ran."""
        return next((r for r in self.results if r.check == check), None)

    @property
    def steps(self) -> list[StepResult]:
        return [s for r in self.results for s in r.steps]

    @property
    def findings(self) -> list[Finding]:
        return [f for r in self.results for f in r.findings]

    @property
    def tokens_sent(self) -> int:
        return sum(r.tokens for r in self.results)

    @property
    def shape(self) -> ShapeChoice | None:
        """The probe shape this run measured and took, where it chose one."""
        return next((r.choice for r in self.results if isinstance(r, ShapeResult)), None)

    @property
    def plans(self) -> list[Plan]:
        """The plans of the checks that run one."""
        return [p.plan for p in self.planned.values() if p.plan is not None]

    @property
    def plan(self) -> Plan | None:
        """Every plan the target's checks ran (or would run), as one."""
        return Plan.joined(self.plans) if self.plans else None

    @property
    def skipped(self) -> dict[str, str]:
        return {e: why for r in self.results for e, why in r.skipped.items()}

    @property
    def notes(self) -> list[str]:
        return [note for r in self.results for note in r.notes]

    @property
    def sights(self) -> dict[str, Sight]:
        """Per content check that got answers (checks whose probes are built alike together, named "a and b"): how
        many of their probes' answers carried their own canary."""
        groups: dict[str, list[tuple[str, Sight]]] = {}
        for r in self.results:
            if (sight := r.sight) is not None:
                groups.setdefault(r.sees_with or r.check, []).append((r.check, sight))
        return {" and ".join(name for name, _ in members): Sight.joined([s for _, s in members])
                for members in groups.values()}

    @property
    def blind(self) -> list[str]:
        """The content checks that got answers and could not see: none of them carried its own canary."""
        return [name for name, sight in self.sights.items() if sight.blind]

    def coverage(self) -> Coverage:
        """Of the requests the plans hold, over every check that runs one (a check stopped before it ran sent none
        of its plan's)."""
        ran = {r.check: r.coverage() for r in self.results if r.planned}
        unobserved: Counter[str] = Counter()
        for part in ran.values():
            unobserved += part.unobserved
        planned = sum(ran[name].planned if name in ran else p.requests for name, p in self.planned.items() if p.plan)
        return Coverage(planned, sum(p.sent for p in ran.values()), unobserved)


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

    @classmethod
    def joined(cls, sights: list[Sight]) -> Sight:
        return cls(sum(s.checked for s in sights), sum(s.echoed for s in sights))

    def reason(self, check: str) -> str:
        return (f"{check} blind: none of {self.checked} probe answers repeated its own tenant's canary, so another "
                "tenant's would not have shown either")

    def to_json(self) -> SightDoc:
        return {"checked": self.checked, "echoed": self.echoed, "blind": self.blind}


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
