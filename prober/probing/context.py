"""One target as every check sees it: surveyed once, its routes (and what the path to the engine adds on each), the
probe shape its requests take, and the few things a check does with it — send as a tenant, plant canaries in a
prompt, judge an answer, make findings durable.  Checks (prober/checks) are written against this and nothing
wider; the audit and the daemon's jobs open one per target and hand it to each check they run.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from prober.capacity import Capacity, origin_of, reachability
from prober.config.schema import TargetConfig
from prober.domain.errors import PlanError, TargetUnusable
from prober.domain.evidence import EngineCounters, PathRange
from prober.domain.types import Finding
from prober.probing.cached import CacheExplainer
from prober.probing.counters import CounterEvidence
from prober.probing.events import FindingRecorded, Listener, Observed, StepDone, SurveyDone, ignore
from prober.probing.judging import Judge
from prober.probing.path import measure as measure_path
from prober.probing.plan import Step, acceptance_limit, pairs
from prober.probing.planting import Planter
from prober.probing.provenance import AnswerBook
from prober.probing.results import CheckResult, ShapeChoice, StepResult
from prober.probing.routes import Route, Routes
from prober.probing.salts import salted_tenants, tenant_salts
from prober.probing.survey import Survey, survey
from prober.probing.wiring import Wiring
from prober.prompts import BuiltPrompt
from prober.targets.base import Prompt
from prober.targets.request_ids import RequestId
from prober.targets.result import Completion
from prober.targets.telemetry import EngineTelemetry, window
from prober.targets.transport import Transport


class TargetContext:
    def __init__(self, config: TargetConfig, transport: Transport, wiring: Wiring, *, telemetry: bool = True) -> None:
        self.config = config
        self.transport = transport
        self.wiring = wiring
        self.routes = Routes(config, transport, lambda route: measure_path(
            route.api, route.counter, self.tenants, lambda tenant, prompt: self.send_as(tenant, prompt, route)))
        self.planter = Planter(wiring)
        self.cached = CacheExplainer(transport.outbox, wiring.secrets)
        self.answers = AnswerBook()  # every answer's name: one served again came from a cache in front of the engine
        self.surveyed: Survey | None = None
        self.shape: ShapeChoice | None = None  # what requests take: measured before the first canary-bearing check
        self._want_telemetry = telemetry
        self.telemetry: EngineTelemetry | None = None  # the engine's counters, where it exposes them
        self.salts = tenant_salts(config, wiring.tenants)  # tenant -> its cache_salt, where the target asks
        self.salted = salted_tenants(config, wiring.tenants, wiring.cache_salted)
        self.judge = Judge(config.name, wiring, transport.scrubber, self.salted)

    @property
    def tenants(self) -> list[str]:
        return list(self.wiring.tenants)

    @property
    def capacity(self) -> Capacity:
        """What the last survey learned (raises PlanError before one)."""
        if self.surveyed is None:
            raise PlanError("survey the target before planning")
        return self.surveyed.capacity

    async def survey(self, on_event: Listener = ignore, *, bisect_budget: int = 0) -> Survey:
        """Reachability with every tenant's credential, then capacity and token counting (raises
        TargetUnusable).  Checks after it build their prompts with what this learned."""
        pairs(self.tenants)  # fails early, with the reason, when there are fewer than two tenants
        cfg = self.config
        if cfg.api.openai_routes:
            for tenant in self.tenants[1:]:  # the first tenant's key is checked by the survey itself
                problem = await reachability(self.transport, cfg.url, self.wiring.secrets.get(tenant))
                if problem:
                    raise TargetUnusable(f"{problem} (tenant {tenant})")
        first = self.wiring.secrets.get(self.tenants[0])
        result, counter = await survey(self.transport, cfg, first, bisect_budget=bisect_budget, bugs=self.wiring.bugs)
        self.surveyed = result
        on_event(SurveyDone(result))
        if result.error or counter is None:
            raise TargetUnusable(result.error or "no way to count tokens")
        self.routes.surveyed(counter, result.capacity.engine, first)
        if self._want_telemetry and self.telemetry is None and cfg.api.openai_routes:
            telemetry = EngineTelemetry(self.transport, origin_of(cfg.introspection_url or cfg.url) + "/metrics", first)
            self.telemetry = telemetry if await telemetry.read() is not None else None
        return result

    async def route(self) -> Route:
        """The chosen shape's route, else the configured one (raises PlanError before a survey)."""
        return await self.routes.get(self.shape.chosen.api if self.shape else self.config.api)

    async def send_as(self, tenant: str, prompt: Prompt, route: Route | None = None) -> Completion:
        """As this tenant: its credential, and its own cache salt where the target asks for one; on the chosen
        route unless another is given.  The answer says whether a cache in front of the engine served it."""
        route = route or await self.route()
        answer = await route.target.complete(replace(prompt, cache_salt=self.salts.get(tenant)),
                                             self.wiring.secrets.get(tenant))
        stored = self.answers.read(tenant, answer, (prompt.turns, prompt.text),
                                   client_id=prompt.request_id.value if prompt.request_id else None)
        return answer if stored is None else replace(answer, from_cache=stored)

    async def send(self, step: Step, built: BuiltPrompt, route: Route, *, request_id: RequestId | None = None,
                   turns: tuple[tuple[str, str], ...] = ()) -> tuple[Completion, int]:
        """A step's prompt as its tenant (named by the client's `request_id` where one is given, after `turns` where
        the conversation has earlier ones): the answer, and how many prompts the target had been sent before."""
        before = self.transport.outbox.started  # also the number this prompt gets as it goes out
        self.cached.sent(before, built)
        prompt = Prompt(built.text, max_tokens=step.max_tokens, stream=step.stream, request_id=request_id,
                        turns=turns, temperature=1.0 if step.sampled else 0.0, logprobs=step.sampled)
        return await self.send_as(step.tenant, prompt, route), before

    async def send_counted(self, step: Step, built: BuiltPrompt, route: Route) -> tuple[Completion, int, bool | None]:
        """As `send`, with the engine's counters read right before and right after: also whether the engine counted
        no prompt meanwhile (None: not known — no prompt counter, or the reads not comparable).  Other users'
        prompts make it False; an engine replica whose metrics these reads do not reach makes it True as a cache
        would."""
        async with window(self.telemetry) as counted:
            answer, before = await self.send(step, built, route)
        return answer, before, counted.took_no_prompt()

    async def hang_up(self, step: Step, built: BuiltPrompt, route: Route, after: float,
                      linger: float) -> tuple[Completion, int] | None:
        """A step's prompt sent as `send` sends it and hung up on `after` seconds in: None where the answer had not
        come by then, else the answer, as `send` gives it.  A request hung up on is counted as out `linger` seconds
        longer (what the engine may take to abort it): the abort it counts is this process's, not other users'."""
        try:
            async with asyncio.timeout(after):
                return await self.send(step, built, route)
        except TimeoutError:
            await self.transport.outbox.linger(linger)
            return None

    async def judged(self, step: Step, exchange: str, built: BuiltPrompt, answer: Completion, route: Route, *,
                     check: str, before: int, engine: EngineCounters | None = None) -> StepResult:
        """The judge's verdict on one answer, its cached tokens explained by what was sent before it (`before`: the
        outbox's count when it was sent); no phantom check where prefill and decode are split (decode counts what
        prefill sent it as cached).  An answer a cache in front served tells nothing of the engine: its text alone
        is judged."""
        split = self.surveyed is not None and self.surveyed.capacity.disaggregation_mode is not None
        path = route.path
        usage = answer.counted_prompt_tokens
        made = answer.from_cache is None
        if made and usage is not None and built.exact:  # one more reading of what the path adds, as the run goes on
            path.observe(step.tenant, usage - (built.tokens - built.path))
        cached = await self.cached.judge(step, built, answer, before=before, counter=route.counter,
                                         overhead=path.high(step.tenant), fresh=not split) if made else []
        limit = acceptance_limit(self.surveyed.capacity) if self.surveyed else None
        ranged = PathRange(path.low(step.tenant), path.high(step.tenant), limit) if limit else None
        return await self.judge.answer(step, exchange, built, answer, check=check, engine=engine, also=cached,
                                       path=ranged)

    async def send_judged(self, step: Step, built: BuiltPrompt, route: Route, *, check: str) -> StepResult:
        """One request that is its own exchange (a probe-shape control, an idle-slot request), sent and judged."""
        answer, before = await self.send(step, built, route)
        return await self.judged(step, step.id, built, answer, route, check=check, before=before)

    async def decide_counters(self, counted: CounterEvidence, on_event: Listener, *, check: str) -> list[Finding]:
        """A run's failure-counter windows against the background (prober/probing/counters.py): its findings,
        durable and told."""
        found = await counted.decided(self.telemetry, self.wiring.counters, quiet=not self.wiring.stopping.is_set())
        return await self.judge.persist(found, None, on_event, check=check)


def record(result: StepResult, check: CheckResult, on_event: Listener, *, others: tuple[str, ...] | None = None,
           counted: bool = False) -> None:
    """Into the check's result, then told (`tell`)."""
    check.steps.append(result)
    if not result.observed and result.step.role != "control":
        check.errors.append(f"{result.step.id} ({result.step.length:,} tokens): "
                            f"{result.answer.error or 'not observed'}")
    tell(result, check.check, on_event, others=others, counted=counted)


def tell(result: StepResult, check: str, on_event: Listener, *, others: tuple[str, ...] | None = None,
         counted: bool = False) -> None:
    """The step, what it observed for incidents (`Observed`: `others` and `counted` as there), then its findings
    (already durable)."""
    on_event(StepDone(result))
    if (seen := Observed.of(result, check, others, counted)) is not None:
        on_event(seen)
    for finding in result.findings:
        on_event(FindingRecorded(finding))
