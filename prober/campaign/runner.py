"""Running plans against a target: mint and persist canaries before any prompt carries them, send, check
every answer, persist every finding before anyone is told.  Returns results; reporting and metrics are
views of them.

`TargetRunner` is one target (its survey, its prompt builder, its engine telemetry) and runs any plan: the
boundary campaign or the daemon's sentinels; each call names who observes it, so the daemon's three jobs can
share one runner.  `Auditor` is the one-shot audit over every configured target.
Ledger writes and scanning run in worker threads, so an event loop that also serves `/metrics` never waits
for a disk or for a detector.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import replace
from secrets import token_hex

from prober.campaign.cached import CacheExplainer
from prober.campaign.counters import CounterEvidence
from prober.campaign.deadlines import (
    DEADLINE_BASE_S,
    SURVEY_ALLOWANCE_S,
    isolation_seconds,
    plan_seconds,
    shape_seconds,
)
from prober.campaign.events import (
    FindingRecorded,
    Listener,
    PlanReady,
    ShapeChosen,
    StepDone,
    SurveyDone,
    TargetFailed,
    ignore,
)
from prober.campaign.isolation import Isolation
from prober.campaign.judging import Judge
from prober.campaign.path import behind_path
from prober.campaign.path import measure as measure_path
from prober.campaign.plan import Aim, Exchange, Plan, Step, Streaming, acceptance_limit, make_plan, pairs
from prober.campaign.planting import ASKED, PRIME_INSTRUCTION, Planter, instruction
from prober.campaign.results import AuditResult, ShapeChoice, StepResult, TargetReport
from prober.campaign.routes import Route, Routes
from prober.campaign.salts import salted_tenants, tenant_salts
from prober.campaign.scanning import RunScanner
from prober.campaign.shapes import CONTROL_ANSWER_TOKENS, CONTROL_TOKENS, choose_shape
from prober.campaign.shapes import planned_tokens as shape_tokens
from prober.campaign.slots import planned_tokens as slot_tokens
from prober.campaign.survey import PreflightResult, survey
from prober.campaign.timing import planned_tokens
from prober.campaign.wiring import Wiring
from prober.canaries.mint import Minter
from prober.capacity import origin_of, reachability
from prober.config import ProberConfig, TargetConfig
from prober.errors import BuildError, CountError, PlanError, TargetUnusable
from prober.prompts import BuiltPrompt
from prober.prompts.shape import Layout, Shape
from prober.scrub import Scrubber
from prober.targets.base import Prompt
from prober.targets.bounds import deadline_passed, run_deadline
from prober.targets.credentials import Secret
from prober.targets.result import Completion
from prober.targets.telemetry import EngineTelemetry, window
from prober.targets.transport import Transport
from prober.types import Finding, ProbeContext

TARGET_DEADLINE = "the audit's deadline for this target"


class TargetRunner:
    def __init__(self, config: TargetConfig, transport: Transport, wiring: Wiring, *, telemetry: bool = True) -> None:
        self.config = config
        self.transport = transport
        self.wiring = wiring
        self.routes = Routes(config, transport, lambda route: measure_path(
            route.api, route.counter, self.tenants, lambda tenant, prompt: self.send_as(tenant, prompt, route)))
        self.planter = Planter(wiring)
        self.cached = CacheExplainer(transport.outbox, wiring.secrets)
        self.surveyed: PreflightResult | None = None
        self.shape: ShapeChoice | None = None  # what requests take: measured before the first canary-bearing run
        self._want_telemetry = telemetry
        self.telemetry: EngineTelemetry | None = None  # the engine's counters, where it exposes them
        self.salts = tenant_salts(config, wiring.tenants)  # tenant -> its cache_salt, where the target asks
        self.salted = salted_tenants(config, wiring.tenants, wiring.cache_salted)
        self.judge = Judge(config.name, wiring, transport.scrubber, self.salted)
        self.isolation = Isolation(self)  # the timing, idle-slot and cross-talk checks

    @property
    def tenants(self) -> list[str]:
        return list(self.wiring.tenants)

    async def survey(self, on_event: Listener = ignore, *, bisect_budget: int = 0) -> PreflightResult:
        """Reachability with every tenant's credential, then capacity and token counting (raises
        TargetUnusable).  A later `run` builds its prompts with what this learned."""
        pairs(self.tenants)  # fails early, with the reason, when there are fewer than two tenants
        cfg = self.config
        if cfg.api.openai_routes:
            for tenant in self.tenants[1:]:  # the first tenant's key is checked by the survey itself
                problem = await reachability(self.transport, cfg.url, self.wiring.secrets.get(tenant))
                if problem:
                    raise TargetUnusable(f"{problem} (tenant {tenant})")
        first = self.wiring.secrets.get(self.tenants[0])
        result, counter = await survey(self.transport, cfg, first, bisect_budget=bisect_budget)
        self.surveyed = result
        on_event(SurveyDone(result))
        if result.error or counter is None:
            raise TargetUnusable(result.error or "no way to count tokens")
        self.routes.surveyed(counter, result.capacity.engine, first)
        if self._want_telemetry and self.telemetry is None and cfg.api.openai_routes:
            telemetry = EngineTelemetry(self.transport, origin_of(cfg.introspection_url or cfg.url) + "/metrics", first)
            self.telemetry = telemetry if await telemetry.read() is not None else None
        return result

    def campaign(self, on_event: Listener = ignore, *, streaming: Streaming, concurrent: bool, rounds: int,
                 max_tokens: int, run_id: str = "") -> Plan:
        """The boundary plan for what the last survey learned."""
        if self.surveyed is None:
            raise PlanError("survey the target before planning")
        plan = make_plan(self.config.name, self.surveyed.capacity, self.tenants, streaming=streaming,
                         concurrent=concurrent, rounds=rounds, max_tokens=max_tokens, run_id=run_id,
                         fact_share=self.wiring.fact_share)
        on_event(PlanReady(plan))
        return plan

    async def choose_shape(self, plan: Plan, report: TargetReport, on_event: Listener = ignore) -> ShapeChoice:
        """Which probe shape brings this target's own canaries back (prober/campaign/shapes.py); every request
        after it takes that shape's route and layout.  The control requests go into `report` as steps."""
        if self.surveyed is None:
            raise PlanError("survey the target before choosing a probe shape")
        limit, page = acceptance_limit(self.surveyed.capacity), self.surveyed.page
        answer_tokens = min(CONTROL_ANSWER_TOKENS, max((s.max_tokens for e in plan.exchanges for s in e.steps),
                                                       default=CONTROL_ANSWER_TOKENS))
        controls = replace(plan, fact_share=0.0)  # token canaries: the question is only whether codes come back

        async def trial(shape: Shape, tenant: str) -> StepResult:
            route = await self.routes.get(shape.api)
            # Short, whatever the path adds in front, and below the limit with it.
            length = min(CONTROL_TOKENS, limit - 1 - route.path.of(tenant)) if limit else CONTROL_TOKENS
            step = Step(id=f"{plan.run_id}c{shape.name}-{tenant}", role="control", tenant=tenant, length=length,
                        stream=False, expect_served=True, boundary=f"shape:{shape.name}", max_tokens=answer_tokens,
                        aim=Aim.NONE)
            cue = shape.layout is Layout.CUE
            built = await self.planter.prompt(step, ASKED["quote"], route, controls, page=page, cue=cue,
                                              lead=cue)
            result = await self.send_and_check(step, built, route)
            record(result, report, on_event)
            return result

        choice = await choose_shape(self.config.shapes, self.tenants, trial, CountError,
                                    stopped=lambda: self.wiring.stop_reason() is not None)
        self.shape = choice
        on_event(ShapeChosen(self.config.name, choice))
        return choice

    async def run(self, plan: Plan, report: TargetReport, on_event: Listener = ignore, *,
                  choose: bool = False) -> str | None:
        """Every exchange of the plan in order, after choosing a probe shape if asked to or none was chosen yet.
        Stops between exchanges, and returns why (also in `errors`), once `stopping` is set, the run's deadline
        (prober/targets/bounds.py) has passed, or the circuit breaker opens: `breaker` answers in a row that could
        not be observed."""
        if choose or self.shape is None:
            report.shape = await self.choose_shape(plan, report, on_event)
        report.paths = self.routes.paths
        counted = CounterEvidence()
        try:
            return await self._exchanges(plan, report, on_event, counted)
        finally:
            report.notes += counted.notes()
            for finding in await self.decide_counters(counted, on_event):
                named = next((s for s in report.steps if s.step.id == finding.record_id), None)
                if named is not None:
                    named.findings.append(finding)

    async def _exchanges(self, plan: Plan, report: TargetReport, on_event: Listener,
                         counted: CounterEvidence) -> str | None:
        unobserved = 0  # in a row
        for exchange in plan.exchanges:
            stop = self.wiring.stop_reason() or (
                f"circuit breaker: {unobserved} answers in a row could not be observed"
                if unobserved >= self.config.breaker else None)
            if stop:
                report.errors.append(f"stopped before {exchange.id}: {stop}")
                return stop
            sent = len(report.steps)
            try:
                await self._exchange(exchange, report, on_event, plan, counted)
            except BuildError as exc:
                behind = behind_path(self.routes.paths, (exchange.victim, exchange.observer))
                if behind is None:
                    raise
                report.skipped[exchange.id] = f"{exchange.probe.boundary}: {exc}, {behind}"
                continue
            for step in report.steps[sent:]:
                unobserved = 0 if step.observed else unobserved + 1
        return None

    async def decide_counters(self, counted: CounterEvidence, on_event: Listener) -> list[Finding]:
        """A run's failure-counter windows against the background (prober/campaign/counters.py): its findings,
        durable and told."""
        found = await counted.decided(self.telemetry, self.wiring.counters, quiet=not self.wiring.stopping.is_set())
        return await self.judge.persist(found, None, on_event)

    # -- one exchange ---------------------------------------------------------------------------
    async def _exchange(self, exchange: Exchange, report: TargetReport, on_event: Listener, plan: Plan,
                        counted: CounterEvidence) -> None:
        route, page = await self.route(), self.surveyed.page if self.surveyed else None
        cue = self.shape is not None and self.shape.chosen.layout is Layout.CUE
        if exchange.same_text:
            prime = await self.planter.plain(exchange.prime, route, token_hex(6))
            probe = replace(prime, fresh_from=None)  # the victim's prompt again: not new when the observer sends it
        else:
            prime = await self.planter.prompt(exchange.prime, PRIME_INSTRUCTION, route, plan, page=page, cue=cue)
            probe = await self.planter.prompt(exchange.probe, instruction(exchange.probe, self.wiring.languages),
                                              route, plan, page=page, cue=cue, lead=cue)
        sends = [(exchange.prime, prime), (exchange.probe, probe)]
        if exchange.lead is not None:  # the observer's prompt before the victim's, then again: not new the second time
            sends = [(exchange.lead, probe), (exchange.prime, prime), (exchange.probe, replace(probe, fresh_from=None))]
        async with window(self.telemetry, len(sends)) as engine:
            if exchange.concurrent:
                sent = list(await asyncio.gather(*(self._send(step, built, route) for step, built in sends)))
            else:
                sent = [await self._send(step, built, route) for step, built in sends]
        # A failure the engine counted meanwhile is named on the observer's answer, else on the victim's.
        named = len(sent) - 1 if sent[-1][0].served else len(sent) - 2
        step, built = sends[named]
        counted.add(engine, request=step.id, tenant=step.tenant,
                    context=ProbeContext(built.tokens, step.boundary, sent[named][0].status),
                    unserved=sum(not answer.served for answer, _ in sent),
                    retried=any(answer.retried for answer, _ in sent))
        for (step, built), (answer, before) in zip(sends, sent, strict=True):
            result = await self.check(step, exchange.id, built, answer, route, before=before,
                                      engine=engine.evidence())
            record(result, report, on_event)

    async def route(self) -> Route:
        """The chosen shape's route, else the configured one (raises PlanError before a survey)."""
        return await self.routes.get(self.shape.chosen.api if self.shape else self.config.api)

    async def check(self, step: Step, exchange: str, built: BuiltPrompt, answer: Completion, route: Route, *,
                    before: int, engine: dict[str, dict[str, float]] | None = None) -> StepResult:
        """The judge's verdict on one answer, its cached tokens explained by what was sent before it (`before`: the
        outbox's count when it was sent); no phantom check where prefill and decode are split (decode counts what
        prefill sent it as cached)."""
        split = self.surveyed is not None and self.surveyed.capacity.disaggregation_mode is not None
        cached = await self.cached.judge(step, built, answer, before=before, counter=route.counter,
                                         overhead=route.path.of(step.tenant), fresh=not split)
        return await self.judge.answer(step, exchange, built, answer, engine=engine, also=cached)

    async def send_and_check(self, step: Step, built: BuiltPrompt, route: Route) -> StepResult:
        """One request of a check that is its own exchange (a probe-shape control, an idle-slot request)."""
        answer, before = await self._send(step, built, route)
        return await self.check(step, step.id, built, answer, route, before=before)

    async def _send(self, step: Step, built: BuiltPrompt, route: Route) -> tuple[Completion, int]:
        """The answer, and how many prompts the target had been sent before this one."""
        before = self.transport.outbox.started  # also the number this prompt gets as it goes out
        self.cached.sent(before, built)
        prompt = Prompt(built.text, max_tokens=step.max_tokens, stream=step.stream)
        return await self.send_as(step.tenant, prompt, route), before

    async def send_as(self, tenant: str, prompt: Prompt, route: Route | None = None) -> Completion:
        """As this tenant: its credential, and its own cache salt where the target asks for one; on the chosen
        route unless another is given."""
        route = route or await self.route()
        return await route.target.complete(replace(prompt, cache_salt=self.salts.get(tenant)),
                                           self.wiring.secrets.get(tenant))


def record(result: StepResult, report: TargetReport, on_event: Listener) -> None:
    """Into the report, then told: the step, then its findings (already durable)."""
    report.steps.append(result)
    if not result.observed and result.step.role != "control":
        report.errors.append(f"{result.step.id} ({result.step.length:,} tokens): "
                             f"{result.answer.error or 'not observed'}")
    on_event(StepDone(result))
    for finding in result.findings:
        on_event(FindingRecorded(finding))


class Auditor:
    """`leakprobe audit`: survey, plan and run the boundary campaign on every configured target, in turn."""

    def __init__(self, config: ProberConfig, minter: Minter, secrets: Mapping[str, Secret | None], *,
                 on_event: Listener = ignore, dry_run: bool = False, scrubber: Scrubber | None = None) -> None:
        """`minter`: the ledger, the deployment key and the embedder, which the audit mints and scans with."""
        self.config = config
        self.scrubber = scrubber or Scrubber()
        self.ledger = minter.ledger
        self.secrets = secrets
        self.minter = minter
        self.on_event = on_event
        self.dry_run = dry_run
        self.tokens_left = config.audit.token_budget

    async def run(self) -> AuditResult:
        result = AuditResult(dry_run=self.dry_run)
        # A dry run sends nothing, so it scans nothing: no need to index the ledger's canaries.
        known = [] if self.dry_run else await asyncio.to_thread(self.ledger.active_canaries)
        prompts = [] if self.dry_run else await asyncio.to_thread(self.ledger.prompt_shingles)
        tenants = [t.name for t in self.config.tenants]
        scanner = await asyncio.to_thread(RunScanner, known, key=self.minter.key, tenants=tenants,
                                          embedder=self.minter.embedder, prompts=prompts)
        wiring = Wiring.of(self.config, self.minter, scanner, self.secrets, self.scrubber)
        deadline = self.config.audit.deadline
        with run_deadline(deadline, "the audit's deadline"):
            for target_config in self.config.targets:
                report = TargetReport(target_config.name, target_config.url)
                result.targets.append(report)
                if deadline_passed():
                    report.errors.append(f"not probed: the audit's deadline of {deadline:g} s passed")
                    continue
                try:
                    with run_deadline(self.config.audit.target_deadline, TARGET_DEADLINE):
                        await self._run_target(target_config, report, wiring)
                except (TargetUnusable, PlanError, CountError, BuildError) as exc:
                    report.errors.append(str(exc))
                    self.on_event(TargetFailed(target_config.name, str(exc)))
        result.finished = time.time()
        return result

    async def _run_target(self, cfg: TargetConfig, report: TargetReport, wiring: Wiring) -> None:
        """Under the target's deadline when one is given, else the survey's allowance and then one derived from
        the plan, the probe-shape choice and the isolation checks (prober/campaign/deadlines.py)."""
        settings = self.config.audit
        derived = settings.target_deadline is None
        async with Transport(cfg.policy(), self.scrubber) as transport:
            runner = TargetRunner(cfg, transport, wiring, telemetry=not self.dry_run)
            try:
                with run_deadline(SURVEY_ALLOWANCE_S if derived else None, TARGET_DEADLINE):
                    await runner.survey(self.on_event, bisect_budget=0 if self.dry_run else settings.bisect_budget)
            finally:
                report.survey = runner.surveyed
            plan = runner.campaign(self.on_event, streaming=settings.streaming, concurrent=settings.concurrent,
                                   rounds=settings.rounds, max_tokens=settings.max_tokens)
            report.plan = plan
            extra = shape_tokens(cfg.shapes, runner.tenants)
            extra += planned_tokens(self.config.timing, runner.tenants) if self.config.timing.audit else 0
            extra += (slot_tokens(self.config.slots, runner.tenants, runner.surveyed.capacity)
                      if self.config.slots.audit and runner.surveyed else 0)
            if plan.tokens + extra > self.tokens_left:
                raise PlanError(f"the plan for {cfg.name} needs {plan.tokens + extra:,} tokens, over the remaining "
                                f"budget of {self.tokens_left:,}; raise --token-budget or lower `rounds`")
            if self.dry_run:
                report.complete = True
                return
            self.tokens_left -= plan.tokens + extra
            rest = (DEADLINE_BASE_S + plan_seconds(plan) + shape_seconds(cfg.shapes, runner.tenants)
                    + isolation_seconds(self.config, runner.tenants))
            with run_deadline(rest if derived else None, TARGET_DEADLINE):
                if await runner.run(plan, report, self.on_event) is None:
                    await self._isolation(runner, report)
            reason = report.coverage().reason()
            if reason:
                report.errors.insert(0, reason)  # the one-line why, ahead of the requests it sums up
            report.complete = not report.errors

    async def _isolation(self, runner: TargetRunner, report: TargetReport) -> None:
        """The timing check and the cross-talk burst, where the config runs them in audits."""
        if self.config.timing.audit:
            report.timing = await runner.isolation.timing(self.config.timing, self.on_event)
            report.errors += report.timing.errors
        if self.config.slots.audit:
            report.slots = await runner.isolation.idle_slots(self.config.slots, self.on_event)
            report.errors += report.slots.errors if report.slots else []
        if self.config.crosstalk.audit:
            report.crosstalk = await runner.isolation.crosstalk(self.config.crosstalk, self.on_event,
                                                      streaming=self.config.audit.streaming)
            report.errors += report.crosstalk.errors
