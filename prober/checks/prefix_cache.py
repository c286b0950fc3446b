"""The prefix-cache check: does another tenant's prompt come back from the cache (the observer resends the victim's
nonce-led prompt), and does a repeat carry what ran in between (A, X, A)?  Where the engine has a second tier (its
usage tells that tier's hits apart, or the target's `lower_tier` says so), the same again with the first tier
evicted by filler before each resend, so that only the second tier can answer.  Cached tokens are explained against
everything sent before (prober/probing/cached.py)."""

from __future__ import annotations

from prober.capacity.known_bugs import Releases
from prober.capacity.limits import Capacity, EngineCache
from prober.checks.base import Run
from prober.checks.bugs import EngineBug
from prober.checks.plans import LONG_PROMPTS, PlanCheck, adder
from prober.domain.errors import PlanError
from prober.domain.types import FindingKind
from prober.probing.cache_map import CacheVerdict, LayerState
from prober.probing.cached import EVICTED
from prober.probing.exchanges import run_plan
from prober.probing.plan import (
    PRIME_ANSWER_TOKENS,
    Aim,
    Boundary,
    Exchange,
    Plan,
    Planned,
    Role,
    Step,
    Streaming,
    pairs,
    prime_length,
)
from prober.probing.results import CheckResult, StepResult
from prober.targets.api import Engine

CACHE_CHECK_TOKENS = 1_024
REPEAT = "repeat"  # the label of an A, X, A exchange's steps
OWN_AGAIN = "prefix-tier2-own"  # the observer's resend of its own resend, after a second eviction: the control
FILLER = "filler"
LOWER = (EVICTED, OWN_AGAIN)  # the boundaries of the resends after an eviction
EVICT_MARGIN = CACHE_CHECK_TOKENS  # filler beyond the pool: the part pages and the prefix every prompt shares
CONNECTOR_LOOKUPS = "vllm:external_prefix_cache_queries_total"  # tokens vLLM asked its KV connector for


# The public engine bugs it catches, as the reference engine reproduces each (the bug table: docs/testbed.md).
BUGS = (
    EngineBug("vLLM #16016, CVE-2025-46570", "one prefix cache for every tenant: another tenant's prompt is served "
              "from cache, and answers sooner", {"shared_prefix_cache": True},
              "the prefix-cache check: the observer resends the victim's prompt; timing: it answers sooner",
              FindingKind.CROSS_TENANT_CACHE_HIT, checks=("prefix-cache", "timing"),
              releases=(Releases(Engine.VLLM, fixed_in="0.9.0"),)),
    EngineBug("SGLang #26747 → #37058 → #38577, #37160; LMCache #4825", "a storage tier keyed without the tenant's "
              "namespace or cache salt: tenant B reads tenant A's pages back", {"storage_tier_ignores_salt": True},
              "the prefix-cache check with a cache salt per tenant: the first tier evicted with filler, the victim's "
              "prompt resent", FindingKind.CROSS_TENANT_CACHE_HIT,
              checks=("prefix-cache",), audit={"cache_salt": "per-tenant"},
              # HiCache's keys take the namespace from 0.5.20 (#38577); the LMCache path (#37160) is still open.
              releases=(Releases(Engine.SGLANG),)),
    EngineBug("vLLM #50630, llama.cpp #28056", "an identical request after one with another prefix carries the "
              "intervening request's content (A, X, A)", {"cache_hit_reads_stale_pages": True},
              "the repeat check: the observer's prompt, the victim's, the observer's again",
              FindingKind.CROSS_TENANT_ECHO, checks=("prefix-cache",),
              releases=(Releases(Engine.VLLM), Releases(Engine.LLAMACPP))),
)


class PrefixCacheCheck(PlanCheck):
    name = "prefix-cache"
    about = "another tenant's prompt resent: served from a shared prefix cache, or a repeat carrying another's"
    every = 21_600.0
    bugs = BUGS
    sees_with = LONG_PROMPTS

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        result = await super().run(run, planned)
        ctx = run.target
        said = {c.layer: c for c in ctx.capacity.caches}
        if ctx.config.lower_tier is None and result.stopped is None:
            reading = await ctx.telemetry.read() if ctx.telemetry is not None else None
            if why := second_tier(result, reading.values.get(CONNECTOR_LOOKUPS, 0.0) if reading else 0.0,
                                  said.get("prefix-tier2")):
                await evict_and_resend(run, result, why)
        route = ctx.shape.chosen.api.value if ctx.shape else ctx.config.api.value
        result.layers.append(prefix_layer(result, route, said.get("prefix")))
        if any(s.step.boundary in LOWER for s in result.steps):
            result.layers.append(tier_layer(result, route))
        return result

    def plan(self, run: Run) -> Plan:
        a, ctx = run.config.audit, run.target
        plan = cache_plan(ctx.config.name, ctx.capacity, ctx.tenants, streaming=a.streaming, max_tokens=a.max_tokens,
                          run_id=run.run_id, fact_share=ctx.wiring.fact_share)
        if ctx.config.lower_tier:  # said to have a second tier: its cost in the plan, and budgeted
            lower_plan(plan, ctx.capacity, ctx.tenants, max_tokens=a.max_tokens)
        return plan


def cache_plan(target: str, capacity: Capacity, tenants: list[str], *, streaming: Streaming = "both",
               max_tokens: int = 160, run_id: str = "", fact_share: float = 0.0) -> Plan:
    """The prefix-cache check (the observer resends the victim's canary-free prompt) and the repeat check (the
    observer's prompt, the victim's, the observer's again), every direction: prompts of the tenant's own text, with
    whatever the path puts in front on top (what a cache between tenants could serve is the part they control), the
    whole short of the acceptance limit by an answer's room (a probe that cannot answer cannot show its own canary)."""
    plan = Plan(target, [], run_id=run_id, fact_share=fact_share, letter="k")
    add = adder(plan, capacity, max_tokens)
    ceiling = prime_length(capacity) - (max_tokens if capacity.advertised else 0)
    cache = Boundary("prefix-cache", max(1, min(CACHE_CHECK_TOKENS, ceiling)), True, aim=Aim.OWN, ceiling=ceiling)
    repeat = Boundary(REPEAT, cache.length, True, aim=Aim.OWN, ceiling=ceiling)
    plan.boundaries = [cache, repeat]
    for victim, observer in pairs(tenants):
        add(victim, observer, cache, False, False, same_text=True)
    # A, X, A: the observer's prompt, another tenant's of the same length, the observer's again (vLLM #50630,
    # llama.cpp #28056: the repeat carried the intervening request's content).
    for d, (victim, observer) in enumerate(pairs(tenants)):
        add(victim, observer, repeat, streaming == "stream" or (streaming == "both" and d % 2 == 1), False,
            first=repeat.length, repeat=True)
    return plan


def second_tier(result: CheckResult, lookups: float, said: EngineCache | None = None) -> str | None:
    """What shows the engine has a second tier (a KV connector, an offload tier), or None: its usage telling that
    tier's cached tokens apart on this check's answers (`external_cached_tokens`, even 0), else its count of tokens
    looked up there (`lookups`: vLLM's `external_prefix_cache_queries`, which moves only with a connector; vLLM
    0.32 keeps the split out of the usage), else its own configuration as the survey read it (`said`: SGLang's
    HiCache, vLLM's CPU offload)."""
    if any(s.answer.usage is not None and s.answer.usage.external_cached_tokens is not None for s in result.steps):
        return "the engine's usage names a second cache tier (external_cached_tokens)"
    if lookups > 0:
        return f"the engine counts {lookups:,.0f} tokens looked up in a second cache tier ({CONNECTOR_LOOKUPS})"
    if said is not None and said.on:
        return f"the engine says it runs a second cache tier{f' ({said.kind})' if said.kind else ''} ({said.source})"
    return None


async def evict_and_resend(run: Run, result: CheckResult, why: str) -> None:
    """The lower-tier exchanges, once the evidence showed a second tier (`why`): a plan of their own, run after the
    first (not in the budget beforehand: `lower_tier: true` puts them there)."""
    ctx, a = run.target, run.config.audit
    plan = Plan(ctx.config.name, [], run_id=run.run_id, letter="kt")
    try:
        lower_plan(plan, ctx.capacity, ctx.tenants, max_tokens=a.max_tokens)
    except PlanError as exc:
        result.notes.append(f"{why}, not tested: {exc}")
        return
    result.notes.append(f"{why}: {plan.tokens:,} more prompt tokens to evict its first tier with filler and resend")
    sent = result.planned
    await run_plan(ctx, plan, result, run.on_event)
    result.planned += sent


def lower_plan(plan: Plan, capacity: Capacity, tenants: list[str], *, max_tokens: int = 160) -> None:
    """Adds, every direction: the victim's nonce-led prompt; filler of the first tier's size (the KV pool, which a
    GPU prefix cache cannot outgrow) as the observer, evicting it; the observer resends the victim's prompt (a hit
    came from a lower tier: another tenant's); filler again; the observer resends it once more (a hit is its own
    resend, read back from the lower tier: the positive control).  Raises PlanError where the pool is unknown."""
    if capacity.pool_tokens is None:
        raise PlanError("the first tier's size is unknown (no KV pool in the capacity): set `capacity.pool_tokens`")
    ceiling = prime_length(capacity) - (max_tokens if capacity.advertised else 0)
    length = max(1, min(CACHE_CHECK_TOKENS, ceiling))
    fill = capacity.pool_tokens.value + EVICT_MARGIN
    count = -(-fill // max(1, ceiling))
    window = capacity.advertised.value if capacity.advertised else None

    def step(eid: str, name: str, tenant: str, size: int, boundary: str, answer: int = PRIME_ANSWER_TOKENS) -> Step:
        room = max(1, min(answer, window - size)) if window else answer
        role: Role = "prime" if name == "prime" else "filler" if boundary == FILLER else "probe"
        return Step(id=f"{eid}-{name}", role=role, tenant=tenant, length=size, stream=False, expect_served=True,
                    boundary=boundary, max_tokens=room, aim=Aim.OWN, ceiling=ceiling)

    plan.boundaries += [Boundary(label, length, True, aim=Aim.OWN, ceiling=ceiling) for label in LOWER]
    for victim, observer in pairs(tenants):
        eid = plan.next_id()
        fillers = [tuple(step(eid, f"fill{n}.{i}", observer, -(-fill // count), FILLER) for i in range(1, count + 1))
                   for n in (1, 2)]
        plan.exchanges.append(Exchange(
            id=eid, victim=victim, observer=observer, same_text=True, prime=step(eid, "prime", victim, length, "prime"),
            probe=step(eid, "probe", observer, length, EVICTED, max_tokens), between=fillers[0],
            after=(*fillers[1], step(eid, "again", observer, length, OWN_AGAIN, max_tokens))))


def prefix_layer(result: CheckResult, route: str, said: EngineCache | None = None) -> CacheVerdict:
    """The engine's prefix cache on the cache map: shared where another tenant's prompt was served from it
    (`cross_tenant_cache_hit`); per tenant where none was but an observer's own repeat (A, X, A) reported more cached
    tokens than its first send of the same prompt (the positive control); none seen where the engine counts cached
    tokens and the repeat reused nothing; undecided where it counts none (a counter that does not move proves
    nothing: llama.cpp #27148) or the repeats went unanswered.  Answers a cache in front served are no reading.
    Where the engine says its prefix cache is off (`said`), a layer with no reuse seen says so: the reason, not a
    proof of isolation."""
    made = [s for s in result.steps if s.answer.served and s.answer.from_cache is None]
    lower = {s.step.id for s in result.steps if s.step.boundary in LOWER}  # a lower tier's, on its own layer
    crossed = sum(f.kind is FindingKind.CROSS_TENANT_CACHE_HIT and f.record_id not in lower for f in result.findings)
    firsts = {s.exchange: _cached(s) for s in made if s.step.role == "lead"}
    repeats = [(firsts[s.exchange], _cached(s)) for s in made
               if s.step.role == "probe" and s.step.boundary == REPEAT and s.exchange in firsts]
    counted = [(first, again) for first, again in repeats if first is not None and again is not None]
    reused = sum(again > first for first, again in counted)
    control = f"an observer's own repeat reused more than its first send in {reused} of {len(repeats)} repeats"
    if crossed:
        return CacheVerdict("prefix", route, LayerState.SHARED, f"{crossed} cross-tenant hits; {control}",
                            len(repeats))
    off = f"; the engine says its prefix cache is off ({said.source})" if said is not None and not said.on else ""
    if not counted:
        why = "the engine reported no cached tokens" if repeats else "no repeat was answered by the engine"
        return CacheVerdict("prefix", route, LayerState.UNDECIDED, why + off, len(repeats))
    state = LayerState.PER_TENANT if reused else LayerState.NONE_SEEN
    return CacheVerdict("prefix", route, state, control + ("" if reused else off), len(repeats))


def tier_layer(result: CheckResult, route: str) -> CacheVerdict:
    """The engine's second tier on the cache map (`prefix-tier2`): shared where the observer's resend of another
    tenant's prompt after the eviction was served from cache; per tenant where none was but its own resend, evicted
    too, came back from the lower tier (at least half of it: the positive control); none seen where it did not;
    undecided where those resends went unanswered or uncounted.  Says which tier answered and how that is known, and
    what the filler cost."""
    made = [s for s in result.steps if s.answer.served and s.answer.from_cache is None]
    crossed = sum(f.kind is FindingKind.CROSS_TENANT_CACHE_HIT for s in result.steps if s.step.boundary == EVICTED
                  for f in s.findings)
    sent = sum(s.step.boundary == OWN_AGAIN for s in result.steps)
    again = [(s, _lower(s)) for s in made if s.step.boundary == OWN_AGAIN]
    counted = [(s, lower) for s, lower in again if lower is not None]
    told = any(s.answer.usage is not None and s.answer.usage.external_cached_tokens is not None for s, _ in counted)
    how = ("by the engine's usage.external_cached_tokens" if told
           else "inferred: the first tier was evicted before each resend")
    reused = sum(2 * lower >= s.step.length for s, lower in counted)
    filler = sum(s.sent_tokens for s in result.steps if s.step.role == FILLER)
    control = (f"an observer's own resend after the first tier was evicted came back from the second tier in {reused} "
               f"of {sent} resends ({how}); {filler:,} filler tokens evicted it")
    if crossed:
        return CacheVerdict("prefix-tier2", route, LayerState.SHARED,
                            f"{crossed} cross-tenant hits with the first tier evicted; {control}", sent)
    if not counted:
        return CacheVerdict("prefix-tier2", route, LayerState.UNDECIDED,
                            f"no resend after the eviction was answered with cached tokens counted; {control}", sent)
    return CacheVerdict("prefix-tier2", route, LayerState.PER_TENANT if reused else LayerState.NONE_SEEN, control, sent)


def _lower(step: StepResult) -> int | None:
    """The cached tokens the second tier served, where the engine says; else all of them (the first was evicted)."""
    usage = step.answer.usage
    if usage is None or step.answer.implausible_usage:
        return None
    return usage.external_cached_tokens if usage.external_cached_tokens is not None else usage.cached_tokens


def _cached(step: StepResult) -> int | None:
    usage = step.answer.usage
    return usage.cached_tokens if usage is not None and not step.answer.implausible_usage else None
