"""The audit: for each target, learn its capacity, plan the boundary campaign, and run it — minting and
persisting canaries before any prompt carries them, checking every answer, persisting every finding as it is
found.  Returns results; reporting is a separate layer."""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import cycle, islice
from secrets import token_hex

from prober.campaign.checks import check_answer
from prober.campaign.plan import Exchange, Plan, PlanError, Step, make_plan, pairs
from prober.campaign.scanning import RunScanner
from prober.canaries.mint import Minter
from prober.capacity import reachability
from prober.config import ProberConfig, TargetConfig
from prober.detect.embedder import Embedder
from prober.ledger.base import Ledger
from prober.preflight import PreflightResult
from prober.preflight import survey as survey_target
from prober.prompts import BuildError, BuiltPrompt, CountError, PromptBuilder
from prober.targets.base import Prompt, Target
from prober.targets.credentials import Secret
from prober.targets.factory import make_target
from prober.targets.result import Completion, ErrorKind
from prober.targets.transport import Transport
from prober.types import Canary, Finding, Record, Severity

PROBE_INSTRUCTION = "Quote the document word for word, including every reference code."
PRIME_INSTRUCTION = "Summarize the document."
DISTINCT_PER_PROMPT = 16  # canaries cycle through a prompt: each names its tenant and step


class TargetUnusable(RuntimeError):
    """The target cannot be audited with these credentials (unreachable, credential refused)."""


@dataclass
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
    def complete(self) -> bool:
        return all(t.complete for t in self.targets)

    def worst(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)


Event = Callable[[str, object], None]  # ("plan", Plan) | ("step", StepResult) | ("finding", Finding) | ...


class Auditor:
    def __init__(self, config: ProberConfig, ledger: Ledger, key: bytes, secrets: dict[str, Secret | None], *,
                 embedder: Embedder | None = None, on_event: Event | None = None, dry_run: bool = False) -> None:
        self.config = config
        self.ledger = ledger
        self.secrets = secrets
        self.tenants = [t.name for t in config.tenants]
        self.minter = Minter(ledger, key)
        self.scanner = RunScanner(ledger.active_canaries(), key=key, tenants=self.tenants, embedder=embedder)
        self.emit: Event = on_event or (lambda kind, payload: None)
        self.dry_run = dry_run
        self.tokens_left = config.audit.token_budget

    async def run(self) -> AuditResult:
        result = AuditResult(dry_run=self.dry_run)
        for target_config in self.config.targets:
            report = TargetReport(target_config.name, target_config.url)
            result.targets.append(report)
            try:
                await self._run_target(target_config, report)
            except (TargetUnusable, PlanError, CountError, BuildError) as exc:
                report.errors.append(str(exc))
                self.emit("error", f"{target_config.name}: {exc}")
        result.finished = time.time()
        return result

    async def _run_target(self, cfg: TargetConfig, report: TargetReport) -> None:
        pairs(self.tenants)  # fails early, with the reason, when there are fewer than two tenants
        async with Transport(cfg.policy()) as transport:
            if cfg.api != "workers-ai":
                for tenant in self.tenants[1:]:  # the first tenant's key is checked by the survey
                    problem = await reachability(transport, cfg.url, self.secrets.get(tenant))
                    if problem:
                        raise TargetUnusable(f"{problem} (tenant {tenant})")
            budget = 0 if self.dry_run else self.config.audit.bisect_budget
            survey, counter = await survey_target(transport, cfg, self.secrets.get(self.tenants[0]),
                                                  bisect_budget=budget)
            report.survey = survey
            if survey.error or counter is None:
                raise TargetUnusable(survey.error or "no way to count tokens")
            target = make_target(cfg, transport)
            builder = PromptBuilder(counter)
            capacity = survey.capacity
            settings = self.config.audit
            plan = make_plan(cfg.name, capacity, self.tenants, streaming=settings.streaming,
                             concurrent=settings.concurrent, rounds=settings.rounds, max_tokens=settings.max_tokens)
            report.plan = plan
            self.emit("plan", plan)
            if plan.tokens > self.tokens_left:
                raise PlanError(f"the plan for {cfg.name} needs {plan.tokens:,} tokens, over the remaining budget "
                                f"of {self.tokens_left:,}; raise --token-budget or lower `rounds`")
            if self.dry_run:
                report.complete = True
                return
            self.tokens_left -= plan.tokens
            page = capacity.page_size.value if capacity.page_size else None
            for exchange in plan.exchanges:
                await self._exchange(exchange, target, builder, page, report)
            report.complete = not report.errors

    async def _exchange(self, exchange: Exchange, target: Target, builder: PromptBuilder, page: int | None,
                        report: TargetReport) -> None:
        if exchange.same_text:
            # Unique to this run, so nothing the observer sent before (in any run) shares its prefix.
            nonce = token_hex(6)
            prime = probe = await builder.build(exchange.prime.length, instruction=f"[{nonce}] {PROBE_INSTRUCTION}",
                                                seed=int(nonce[:4], 16))
        else:
            prime = await self._build(exchange.prime, PRIME_INSTRUCTION, builder, page)
            probe = await self._build(exchange.probe, PROBE_INSTRUCTION, builder, page)
        sends = [(exchange.prime, prime), (exchange.probe, probe)]
        if exchange.concurrent:
            answers = await asyncio.gather(*(self._send(target, step, built) for step, built in sends))
        else:
            answers = [await self._send(target, step, built) for step, built in sends]
        for (step, built), answer in zip(sends, answers, strict=True):
            self._judge(exchange, step, built, answer, report)

    async def _build(self, step: Step, instruction: str, builder: PromptBuilder, page: int | None) -> BuiltPrompt:
        def mint(count: int) -> list[Canary]:
            # Persisted by the minter before this returns: before any prompt that carries them exists.
            distinct = self.minter.tokens(step.tenant, min(count, DISTINCT_PER_PROMPT), probe_id=step.id)
            self.scanner.add(distinct)
            return list(islice(cycle(distinct), count))
        return await builder.build(step.length, instruction=instruction, mint=mint, page_size=page,
                                   seed=zlib.crc32(step.id.encode()) & 0xFFFF)

    async def _send(self, target: Target, step: Step, built: BuiltPrompt) -> Completion:
        prompt = Prompt(built.text, max_tokens=step.max_tokens, stream=step.stream)
        return await target.complete(prompt, self.secrets.get(step.tenant))

    def _judge(self, exchange: Exchange, step: Step, built: BuiltPrompt, answer: Completion,
               report: TargetReport) -> None:
        findings = check_answer(step, built.tokens, answer, report.name,
                                repeats_other_tenant=exchange.same_text and step.role == "probe")
        own = 0
        if answer.text:
            scanned = self.scanner.scan(Record(step.id, step.tenant, answer.text, built.text))
            own = len(scanned.own_echoes)
            context = {"target": report.name, "prompt_tokens": built.tokens, "boundary": step.boundary,
                       "status": answer.status, "exchange": exchange.id}
            findings += [replace(f, probe_id=f.probe_id or step.id, details={**f.details, **context})
                         for f in scanned.findings]
        if findings:
            self.ledger.add_findings(findings, target=report.name)  # durable before anyone is told
        result = StepResult(step, exchange.id, report.name, built.tokens, built.counted, answer,
                            sorted({c.id for c in built.canaries}), findings, own)
        report.steps.append(result)
        if answer.error is not None and not _answered(answer):
            report.errors.append(f"{step.id} ({step.length:,} tokens): {answer.error}")
        self.emit("step", result)
        for finding in findings:
            self.emit("finding", finding)


def _answered(answer: Completion) -> bool:
    """The engine gave its verdict (an answer, a refusal, or its own 5xx); anything else means this request
    could not be observed, and the audit is incomplete."""
    if answer.error is None or answer.refused:
        return True
    return answer.error.kind is ErrorKind.SERVER_ERROR and answer.status is not None
