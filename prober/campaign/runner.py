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

from prober.campaign.checks import counted_failure, phantom_cached
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
from prober.campaign.plan import Exchange, Plan, Step, Streaming, acceptance_limit, make_plan, pairs
from prober.campaign.planting import ASKED, LANGUAGE_NAMES, PRIME_INSTRUCTION, Planter
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
from prober.types import Finding

TARGET_DEADLINE = "the audit's deadline for this target"


class TargetRunner:
    def __init__(self, config: TargetConfig, transport: Transport, wiring: Wiring, *, telemetry: bool = True) -> None:
        self.config = config
        self.transport = transport
        self.wiring = wiring
        self.routes = Routes(config, transport)
        self.planter = Planter(wiring)
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
            self.telemetry = telemetry if await telemetry.snapshot() is not None else None
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
        limit = acceptance_limit(self.surveyed.capacity)
        length = min(CONTROL_TOKENS, limit - 1) if limit else CONTROL_TOKENS
        answer_tokens = min(CONTROL_ANSWER_TOKENS, max((s.max_tokens for e in plan.exchanges for s in e.steps),
                                                       default=CONTROL_ANSWER_TOKENS))
        controls = replace(plan, fact_share=0.0)  # token canaries: the question is only whether codes come back

        async def trial(shape: Shape, tenant: str) -> StepResult:
            route = await self.routes.get(shape.api)
            step = Step(id=f"{plan.run_id}c{shape.name}-{tenant}", role="control", tenant=tenant, length=length,
                        stream=False, expect_served=True, boundary=f"shape:{shape.name}", max_tokens=answer_tokens)
            cue = shape.layout is Layout.CUE
            built = await self.planter.prompt(step, ASKED["quote"], route.builder, controls, page=self.page, cue=cue,
                                              lead=cue)
            answer = await self.send_as(tenant, Prompt(built.text, max_tokens=step.max_tokens), route)
            result = await self.check(step, step.id, built, answer)
            self._record(result, report, on_event)
            return result

        choice = await choose_shape(self.config.shapes, self.tenants, trial, CountError,
                                    stopped=lambda: self._stop_reason() is not None)
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
        unobserved = 0  # in a row
        for exchange in plan.exchanges:
            stop = self._stop_reason() or (f"circuit breaker: {unobserved} answers in a row could not be observed"
                                           if unobserved >= self.config.breaker else None)
            if stop:
                report.errors.append(f"stopped before {exchange.id}: {stop}")
                return stop
            sent = len(report.steps)
            await self._exchange(exchange, report, on_event, plan)
            for step in report.steps[sent:]:
                unobserved = 0 if step.observed else unobserved + 1
        return None

    def _stop_reason(self) -> str | None:
        """Why no request may start now, if one may not."""
        if self.wiring.stopping.is_set():
            return "shutting down"
        moved = self.wiring.ledger.identity_problem()  # its canaries could not be kept where they belong
        return moved or deadline_passed()

    # -- one exchange ---------------------------------------------------------------------------
    async def _exchange(self, exchange: Exchange, report: TargetReport, on_event: Listener, plan: Plan) -> None:
        route = await self.route()
        builder, cue = route.builder, self.shape is not None and self.shape.chosen.layout is Layout.CUE
        if exchange.same_text:
            # Unique to this run, so nothing the observer sent before (in any run) shares its prefix.
            nonce = token_hex(6)
            prime = await builder.build(exchange.prime.length, instruction=ASKED["quote"], nonce=nonce,
                                        seed=int(nonce[:4], 16))
            probe = replace(prime, fresh_from=None)  # the victim's prompt again: not new when the observer sends it
        else:
            prime = await self.planter.prompt(exchange.prime, PRIME_INSTRUCTION, builder, plan, page=self.page,
                                              cue=cue)
            probe = await self.planter.prompt(exchange.probe, self._instruction(exchange.probe), builder, plan,
                                              page=self.page, cue=cue, lead=cue)
        sends = [(exchange.prime, prime), (exchange.probe, probe)]
        if exchange.lead is not None:  # the observer's prompt before the victim's, then again: not new the second time
            sends = [(exchange.lead, probe), (exchange.prime, prime), (exchange.probe, replace(probe, fresh_from=None))]
        async with window(self.telemetry) as engine:
            if exchange.concurrent:
                answers = list(await asyncio.gather(*(self._send(step, built) for step, built in sends)))
            else:
                answers = [await self._send(step, built) for step, built in sends]
        # The observer's resend shows a shared cache only if the victim's first send was not itself claimed
        # from a cache that cannot have held it.
        shared = exchange.same_text and phantom_cached(answers[0], prime.fresh_from) is None
        # A failure the engine counted meanwhile is named on the observer's answer, else on the victim's.
        named = len(answers) - 1 if answers[-1].served else len(answers) - 2
        unserved = sum(not answer.served for answer in answers)
        for i, ((step, built), answer) in enumerate(zip(sends, answers, strict=True)):
            primed_by = exchange.victim if shared and step.role == "probe" else None
            failed = counted_failure(step, built.tokens, answer, engine.failures(), unserved) if i == named else None
            result = await self.check(step, exchange.id, built, answer, engine=engine.evidence(),
                                       primed_by=primed_by, also=[failed] if failed else [])
            self._record(result, report, on_event)

    @staticmethod
    def _record(result: StepResult, report: TargetReport, on_event: Listener) -> None:
        """Into the report, then told: the step, then its findings (already durable)."""
        report.steps.append(result)
        if not result.observed and result.step.role != "control":
            report.errors.append(f"{result.step.id} ({result.step.length:,} tokens): "
                                 f"{result.answer.error or 'not observed'}")
        on_event(StepDone(result))
        for finding in result.findings:
            on_event(FindingRecorded(finding))

    async def route(self) -> Route:
        """The chosen shape's route, else the configured one (raises PlanError before a survey)."""
        return await self.routes.get(self.shape.chosen.api if self.shape else self.config.api)

    async def check(self, step: Step, exchange: str, built: BuiltPrompt, answer: Completion, *,
                     engine: dict[str, dict[str, float]] | None = None, primed_by: str | None = None,
                     also: list[Finding] | None = None) -> StepResult:
        """The judge's verdict on one answer; no phantom check where prefill and decode are split (decode counts
        what prefill sent it as cached)."""
        split = self.surveyed is not None and self.surveyed.capacity.disaggregation_mode is not None
        return await self.judge.answer(step, exchange, built, answer, engine=engine, primed_by=primed_by,
                                       fresh=not split, also=also)

    @property
    def page(self) -> int | None:
        """The KV page size the last survey learned, which canaries in prompts are spaced by."""
        known = self.surveyed.capacity.page_size if self.surveyed else None
        return known.value if known else None

    def _instruction(self, step: Step) -> str:
        """A translation goes into the language the observer does not write in, so its own canaries (and any
        other tenant's that leak) come out in the other language."""
        other = "ko" if self.wiring.languages.get(step.tenant, "en") == "en" else "en"
        return ASKED[step.ask].format(language=LANGUAGE_NAMES[other])

    async def _send(self, step: Step, built: BuiltPrompt) -> Completion:
        return await self.send_as(step.tenant, Prompt(built.text, max_tokens=step.max_tokens, stream=step.stream))

    async def send_as(self, tenant: str, prompt: Prompt, route: Route | None = None) -> Completion:
        """As this tenant: its credential, and its own cache salt where the target asks for one; on the chosen
        route unless another is given."""
        route = route or await self.route()
        return await route.target.complete(replace(prompt, cache_salt=self.salts.get(tenant)),
                                           self.wiring.secrets.get(tenant))


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
            slots = runner.surveyed.capacity.slots if runner.surveyed else None
            extra = shape_tokens(cfg.shapes, runner.tenants)
            extra += planned_tokens(self.config.timing, runner.tenants) if self.config.timing.audit else 0
            extra += (slot_tokens(self.config.slots, runner.tenants, slots.value if slots else None)
                      if self.config.slots.audit else 0)
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
