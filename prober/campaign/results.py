"""What running plans produced: per request, per target, per audit.  Reports and metrics are views of these."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prober.campaign.plan import Plan, Step
from prober.campaign.survey import PreflightResult
from prober.incidents import Incident, group
from prober.targets.result import Completion
from prober.types import Finding, Severity


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
    def outcome(self) -> str:
        """served | refused | an error kind (timeout, connect, server_error, ...)."""
        if self.answer.served:
            return "served"
        if self.answer.refused:
            return "refused"
        return self.answer.error.kind.value if self.answer.error else "unknown"


@dataclass
class TargetReport:
    name: str
    url: str
    survey: PreflightResult | None = None  # capacity, verdicts, tokenizer: learned before the first prompt
    plan: Plan | None = None
    steps: list[StepResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    complete: bool = False

    @property
    def findings(self) -> list[Finding]:
        return [f for s in self.steps for f in s.findings]

    @property
    def tokens_sent(self) -> int:
        return sum(s.sent_tokens for s in self.steps)


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

    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)
