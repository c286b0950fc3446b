"""The response-cache check: does a cache in front of the engine (a gateway's) hand one tenant the answer it stored
for another?

On every generation route the target serves (chat, completions, the Responses API), for every direction: tenant A sends
a fresh canary-free prompt led by a nonce, tenant B sends the same request, then A again.  An answer the engine made has
an `id` of its own; one a cache served repeats the stored answer whole, or the gateway says so in a header
(prober/probing/provenance.py).  A cache that names each copy afresh and says nothing is told by the engine's prompt
counter standing still, or, the requests being sampled, by a repeat saying byte for byte what A's first answer said,
which a fresh decode says again only by a chance its log-probabilities put at e^-30 or less.  So B's answer repeating
A's is a cache shared across tenants (LiteLLM #29955: its key is model + messages + settings, not the caller) —
`cross_tenant_response_cache`, high, for any check that meets it; A's repeat served from the cache while B's was made is
a cache scoped per tenant (`tenant_response_cache`, info); neither served from a cache is no cache seen.  A's repeat is
the positive control: without it no answer can say "per tenant", only that no cache was seen (vLLM #53347: a test of "no
reuse across tenants" also passes with the cache off).  Each route gets its own word in the cache map, since a gateway
may scope its cache on one route and not on another (LiteLLM CVE-2026-89032), and so does each route's streamed
requests, which a gateway may key apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from secrets import token_hex

from pydantic import Field

from prober.checks.base import Check, Run
from prober.config.sections import Strict
from prober.domain.errors import BuildError, CountError, PlanError
from prober.domain.evidence import CacheLayer, FromCache
from prober.domain.types import DetectorName, Finding, FindingKind, ProbeContext, Severity
from prober.probing.cache_map import (
    GENERATION_ROUTES,
    CacheVerdict,
    LayerState,
    RouteName,
    by_route,
    routes_to_test,
)
from prober.probing.context import record
from prober.probing.judging import copied
from prober.probing.plan import Aim, Planned, Step, pairs
from prober.probing.results import CheckResult, StepResult
from prober.probing.routes import Route
from prober.prompts import BuiltPrompt
from prober.targets.api import Api
from prober.targets.result import Completion

INSTRUCTION_TOKENS = 48
NOT_SERVED = "route not served"
IDENTITY = "identity"  # the cache map's word for what the path does with tenants on the way to the engine


class ResponseCacheSettings(Strict):
    """A cache in front of the engine shared between tenants: each tenant's fresh request sent again by another."""

    audit: bool = False
    """Run the response-cache check in every `leakprobe audit` (else only where `--check` names it); the daemon
    runs it on its schedule."""
    routes: tuple[RouteName, ...] = GENERATION_ROUTES
    """The generation routes to test, where the target serves them (a gateway may scope its cache on one only; LiteLLM
    CVE-2026-89032 shared it on the Responses API's alone)."""
    streamed: bool = True
    """Each route again with streamed requests, its own layer of the map (`chat-stream`, …): a gateway may key a
    stream apart from a plain request (LiteLLM 1.108.7 does, and shares both)."""
    tokens: int = Field(default=48, ge=16, le=4096)
    """Prompt length of each request (a gateway's system prompt comes on top)."""
    max_tokens: int = Field(default=32, ge=1, le=1024)
    """Completion tokens per request: an answer with an id is all the other signs need; a sample long enough that a
    fresh decode will not say it again is what `sampled` needs (on the project's vLLM at 16 tokens, 6 of 24 first
    answers could have been said again by a chance over e^-30; at 32, none of 24)."""
    sampled: bool = True
    """Each request sampled at temperature 1 with its tokens' log-probabilities (chat and completions): a repeat
    byte-identical to A's first answer, which a fresh decode says again with probability e^-30 or less by the
    engine's own count, was stored, not made.  It tells a cache that renames its copies and sends no header where
    the engine's counters cannot be read; off, every request is greedy and equal answers tell nothing."""


@dataclass(kw_only=True)
class ResponseCacheResult(CheckResult):
    content: bool = False  # its prompts carry no canary: it reads who was served whose answer, not text
    echoed: int = 0  # answers the engine made that said back their own prompt's nonce
    counted: int = 0  # requests the engine's prompt counter was read around (the sign of a copy that looks made)
    first_logprobs: list[float] = field(default_factory=list)  # where the engine gave them with its first answers

    @property
    def sighted(self) -> bool:
        """An answer the engine made repeated its prompt's nonce, so a clean one would have shown another tenant's
        data: its clean answers re-check what only content shows (an echo or foreign text its answers carried)."""
        return self.echoed > 0

    def summary(self) -> str:
        words = ", ".join(f"{v.route} {v.state}" for v in self.layers) or "no route tested"
        rare = sum(p <= UNLIKELY for p in self.first_logprobs)
        return (f"response cache: {words}; {len(self.steps)} requests ({self.counted} with the engine's prompt "
                f"counter read; {rare} of {len(self.first_logprobs)} sampled first answers too unlikely to be said "
                f"again), {len(self.findings)} findings")


class ResponseCacheCheck(Check):
    name = "response-cache"
    about = "a cache in front of the engine that serves one tenant the answer it stored for another"
    every = 1_800.0  # a dozen short requests: cheap enough for every half hour
    docs = "checks.md"
    settings = ResponseCacheSettings

    def planned(self, run: Run) -> Planned:
        settings = run.config.section(self.name, ResponseCacheSettings)
        requests = (3 * len(pairs(run.target.tenants)) * len(routes_to_test(run.target.config.api, settings.routes))
                    * (2 if settings.streamed else 1))
        # The quote instruction and the chat template come on top of the words it writes.
        return Planned.of(requests * (settings.tokens + INSTRUCTION_TOKENS), requests, requests * settings.max_tokens)

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        settings = run.config.section(self.name, ResponseCacheSettings)
        result = ResponseCacheResult(check=self.name)
        passes: list[Pass | CacheVerdict] = []
        for api in routes_to_test(run.target.config.api, settings.routes):
            passes += await self._route(run, settings, api, result)
        uncounted = _uncounted([p for p in passes if isinstance(p, Pass)], result)
        if result.first_logprobs:
            spread = f"{min(result.first_logprobs):.0f} to {max(result.first_logprobs):.0f}"
            result.notes.append(f"response cache: the sampled first answers' log-probabilities ran from {spread}; a "
                                f"repeat of one at or under {UNLIKELY:.0f} byte for byte is read as a stored copy")
        for sent in passes:
            result.layers += [sent] if isinstance(sent, CacheVerdict) else await self._judged(run, sent, uncounted,
                                                                                               result)
        if result.steps and (split := by_route(result.layers, CacheLayer.RESPONSE, result.steps[-1].step)):
            result.extra += await run.target.judge.persist([split], None, run.on_event, check=self.name)
        return result

    async def _route(self, run: Run, settings: ResponseCacheSettings, api: Api,
                     result: ResponseCacheResult) -> list[Pass | CacheVerdict]:
        """The route's plain requests, then (`streamed`) its streamed ones, each pass a layer of its own."""
        ctx = run.target
        try:
            route = await ctx.routes.get(api)
        except (PlanError, CountError) as exc:
            (result.errors if api is ctx.config.api else result.notes).append(f"response cache on {api}: {exc}")
            return [CacheVerdict(CacheLayer.RESPONSE, api.value, LayerState.UNDECIDED, f"route not usable: {exc}")]
        plain = await self._send(run, settings, route, False, result)
        if not settings.streamed or (isinstance(plain, CacheVerdict) and plain.control == NOT_SERVED):
            return [plain]
        return [plain, await self._send(run, settings, route, True, result)]

    async def _judged(self, run: Run, sent: Pass, uncounted: set[str], result: ResponseCacheResult
                      ) -> list[CacheVerdict]:
        """A pass's answers judged, each repeat known as a copy first where the engine counted no prompt for it or
        it says again what a sample said (none is judged as the engine's before the whole run says which are); then
        the response cache on the pass's route (plain or streamed), and the path's identity layer where a request
        of the pass reached the engine."""
        directions = []
        for first, other, again in sent.directions:
            judged = []
            for request, answer in ((first, first.answer), (other, _copy(other, first, uncounted)),
                                    (again, _copy(again, first, uncounted))):
                step = await run.target.judged(request.step, request.exchange, request.built, answer, sent.route,
                                               check=self.name, before=request.before)
                record(step, result, run.on_event)
                judged.append(step)
                result.echoed += answer.served and answer.from_cache is None and request.nonce in answer.text
            directions.append((judged[0], judged[1], judged[2]))
        verdict = await self._verdict(run, sent.where, directions, result)
        served = [d for d in directions if all(s.answer.served for s in d)]
        upstream = identity(sent.where, served, salted=bool(run.target.salts))
        return [verdict] if upstream is None else [verdict, upstream]

    async def _send(self, run: Run, settings: ResponseCacheSettings, route: Route, stream: bool,
                    result: ResponseCacheResult) -> Pass | CacheVerdict:
        """Every direction's three requests, one after another (each may be served what the one before it left),
        with what the engine counted for each, judged once the whole run is in; a verdict where the route is not
        served or no prompt could be built."""
        ctx, api = run.target, route.api
        where = f"{api}-stream" if stream else api.value
        sent = Pass(where, route)
        for n, (a, b) in enumerate(pairs(ctx.tenants), 1):
            step = Step(id=f"{run.run_id}rc-{where}-{n}-prime", role="prime", tenant=a, length=settings.tokens,
                        max_tokens=settings.max_tokens, expect_served=True, boundary="response-cache", aim=Aim.NONE,
                        stream=stream, sampled=settings.sampled)
            steps = [step, replace(step, id=f"{run.run_id}rc-{where}-{n}-probe", role="probe", tenant=b),
                     replace(step, id=f"{run.run_id}rc-{where}-{n}-control", role="control")]
            nonce = token_hex(6)
            try:
                built = await ctx.planter.plain(steps[0], route, nonce)
            except BuildError as exc:
                result.errors.append(f"response cache on {where}: {exc}")
                return CacheVerdict(CacheLayer.RESPONSE, where, LayerState.UNDECIDED, str(exc))
            answers = []
            for step in steps:
                answer, before, silent = await ctx.send_counted(step, built, route)
                sent.counted[step.id] = silent
                result.counted += silent is not None
                answers.append(Sent(step, f"{run.run_id}rc-{where}-{n}", built, nonce, answer, before))
            first = answers[0]
            if (made := first.answer).served and made.from_cache is None and made.logprob is not None:
                result.first_logprobs.append(made.logprob)
            if not first.answer.served and first.answer.status == 404 and api is not ctx.config.api:
                result.notes.append(f"response cache: the target does not serve the {api} route (404)")
                return CacheVerdict(CacheLayer.RESPONSE, where, LayerState.UNDECIDED, NOT_SERVED)
            sent.directions.append((first, answers[1], answers[2]))
        return sent

    async def _verdict(self, run: Run, where: str, directions: list[Direction],
                       result: ResponseCacheResult) -> CacheVerdict:
        """The response cache's layer: B served A's stored answer (shared), A's repeat served from the cache with B's
        made (per tenant), neither (none seen), or directions unanswered (undecided)."""
        ctx = run.target
        shared: list[tuple[str, str]] = []
        controls = made = unserved = 0
        for first, other, again in directions:
            if not all(s.answer.served for s in (first, other, again)):
                unserved += 1
                continue
            made += first.answer.from_cache is None
            if (stored := other.answer.from_cache) is not None:
                a, b = first.step.tenant, other.step.tenant
                shared.append((a, b))
                if not any(f.kind is FindingKind.CROSS_TENANT_RESPONSE_CACHE for f in other.findings):
                    # Told by a header alone: the prompt was new to this run, and only `a` had sent it.
                    found = copied(other.step, a, stored, f"answered a request only {a} had sent")
                    result.extra += await ctx.judge.persist([found], None, run.on_event, check=self.name)
            controls += again.answer.from_cache is not None
        pairs_run = len(directions)
        control = f"same tenant's repeat served from the cache in {controls} of {pairs_run} directions"
        if shared:
            who = ", ".join(f"{b} served {a}'s answer" for a, b in shared)
            return CacheVerdict(CacheLayer.RESPONSE, where, LayerState.SHARED, f"{who}; {control}", pairs_run)
        if unserved:
            result.errors.append(f"response cache on {where}: {unserved} of {pairs_run} directions not answered")
            return CacheVerdict(CacheLayer.RESPONSE, where, LayerState.UNDECIDED, control, pairs_run)
        if controls:
            result.extra += await ctx.judge.persist([_scoped(result.steps[-1].step, where, control)], None,
                                                    run.on_event, check=self.name)
            return CacheVerdict(CacheLayer.RESPONSE, where, LayerState.PER_TENANT, control, pairs_run)
        return CacheVerdict(CacheLayer.RESPONSE, where, LayerState.NONE_SEEN,
                            f"every answer made afresh ({made} first requests); {control}", pairs_run)


def _scoped(step: Step, where: str, control: str) -> Finding:
    return Finding(record_id=step.id, kind=FindingKind.TENANT_RESPONSE_CACHE, detector=DetectorName.ENVELOPE,
                   severity=Severity.INFO, score=1.0, observer_tenant=step.tenant, probe_id=step.id,
                   context=ProbeContext(boundary=step.boundary),
                   excerpt=f"a response cache on the {where} route, per tenant: {control}")


Direction = tuple[StepResult, StepResult, StepResult]  # A's request, B's same request, A's again
UNCOUNTED = "the engine counted no prompt"
# Nats: a sampled answer a fresh decode says again with probability e^-30 (1e-13) or less, by the engine's count of
# its tokens' log-probabilities.  The margin is for samplers that keep only the likeliest tokens (top-k, top-p,
# min-p) and report the model's own probabilities: each kept token's chance rises by the share of those dropped.
UNLIKELY = -30.0


@dataclass(frozen=True)
class Sent:
    """One request as sent, its answer not yet judged: whether it is a copy is known only once the run is in."""

    step: Step
    exchange: str
    built: BuiltPrompt
    nonce: str
    answer: Completion
    before: int  # the outbox's count when it was sent (what its cached tokens are explained by)


@dataclass
class Pass:
    """One route's requests, plain or streamed, sent one by one; judged and read as a layer once the whole run is
    in."""

    where: str
    route: Route
    directions: list[tuple[Sent, Sent, Sent]] = field(default_factory=list)
    counted: dict[str, bool | None] = field(default_factory=dict)  # step id -> the engine counted no prompt for it


def _uncounted(passes: list[Pass], result: ResponseCacheResult) -> set[str]:
    """The repeats (B's request, A's again) answered while the engine counted no prompt: copies from a cache that
    names each copy afresh and says nothing.  Trusted only where every first request, a prompt no cache can hold yet,
    was counted: one that was not says these reads miss some of the engine's prompts (another replica behind the
    address took it), and then a silent counter says nothing."""
    firsts = [p.counted.get(first.step.id) for p in passes for first, _, _ in p.directions if first.answer.served]
    if True in firsts:
        result.notes.append("response cache: the engine's counters missed a prompt no cache could have answered "
                            "(replicas behind the address?): they are not read for copies")
        return set()
    if False not in firsts:
        return set()
    return {s.step.id for p in passes for _, other, again in p.directions for s in (other, again)
            if p.counted.get(s.step.id)}


def _copy(sent: Sent, first: Sent, uncounted: set[str]) -> Completion:
    """The answer as a cache's copy where the engine counted no prompt for it, or where it says again what the
    sample `first` (A's first request, the same prompt) said (`said_again`); as it came where nothing else told it
    already."""
    answer = sent.answer
    if not answer.served or answer.from_cache is not None:
        return answer
    told = UNCOUNTED if sent.step.id in uncounted else said_again(answer, first.answer)
    return answer if told is None else replace(answer, from_cache=FromCache(CacheLayer.RESPONSE, told,
                                                                            answer.answer_id))


def said_again(answer: Completion, sample: Completion) -> str | None:
    """How `answer` shows it is a stored copy of `sample`, an answer the engine made to the same request at
    temperature 1: it says the same text byte for byte, which a fresh decode says with probability e^logprob, here
    e^UNLIKELY or less (None: not so, or not known, as from an engine that gives no log-probabilities or samples
    greedily, whose answers repeat)."""
    if not (sample.served and sample.from_cache is None and sample.logprob is not None
            and sample.logprob <= UNLIKELY and answer.full_text == sample.full_text):
        return None
    return f"a sampled answer said again byte for byte (a fresh decode says it with probability e^{sample.logprob:.0f})"


def identity(where: str, directions: list[Direction], *, salted: bool) -> CacheVerdict | None:
    """Whether the path keeps tenants apart on the way to the engine, from the requests of `where` that reached it
    (None: a cache in front answered them all).  B's request, the same as A's, served from the engine's prefix cache
    that A's filled (`cross_tenant_cache_hit`) is one identity upstream: one key, the salt dropped or ignored
    (`shared`); A's own repeat reusing its prefix while B's reused nothing is tenants kept apart (`per_tenant`, its
    control); no reuse at all is `none_seen`; no cached tokens counted, `undecided`."""
    reached = [(first, other, again) for first, other, again in directions if other.answer.from_cache is None]
    if not reached:
        return None
    crossed = [other.step.tenant for _, other, _ in reached
               if any(f.kind is FindingKind.CROSS_TENANT_CACHE_HIT for f in other.findings)]
    own = [again for _, _, again in reached if again.answer.from_cache is None and again.answer.usage is not None]
    reused = sum(bool(again.answer.usage and again.answer.usage.cached_tokens) for again in own)
    control = f"a tenant's own repeat reused its prefix at the engine in {reused} of {len(own)} directions"
    if crossed:
        why = " (a cache salt per tenant was sent: the path drops it or the engine ignores it)" if salted else ""
        return CacheVerdict(IDENTITY, where, LayerState.SHARED, f"{', '.join(crossed)} reached the engine as another "
                            f"tenant's identity: served from the prefix cache that tenant's request filled{why}; "
                            f"{control}", len(reached))
    if all(other.answer.usage is None or other.answer.usage.cached_tokens is None for _, other, _ in reached):
        return CacheVerdict(IDENTITY, where, LayerState.UNDECIDED, "the engine reported no cached tokens",
                            len(reached))
    return CacheVerdict(IDENTITY, where, LayerState.PER_TENANT if reused else LayerState.NONE_SEEN, control,
                        len(reached))
