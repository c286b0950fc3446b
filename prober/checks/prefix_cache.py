"""The prefix-cache check: does another tenant's prompt come back from the cache (the observer resends the victim's
nonce-led prompt), and does a repeat carry what ran in between (A, X, A)?  Cached tokens are explained against
everything sent before (prober/probing/cached.py)."""

from __future__ import annotations

from prober.capacity.known_bugs import Releases
from prober.capacity.limits import Capacity
from prober.checks.base import Run
from prober.checks.bugs import EngineBug
from prober.checks.plans import LONG_PROMPTS, PlanCheck, adder
from prober.domain.types import FindingKind
from prober.probing.cache_map import CacheVerdict, LayerState
from prober.probing.plan import Aim, Boundary, Plan, Planned, Streaming, pairs, prime_length
from prober.probing.results import CheckResult, StepResult
from prober.targets.api import Engine

CACHE_CHECK_TOKENS = 1_024
REPEAT = "repeat"  # the label of an A, X, A exchange's steps


# The public engine bugs it catches, as the reference engine reproduces each (the bug table: docs/testbed.md).
BUGS = (
    EngineBug("vLLM #16016, CVE-2025-46570", "one prefix cache for every tenant: another tenant's prompt is served "
              "from cache, and answers sooner", {"shared_prefix_cache": True},
              "the prefix-cache check: the observer resends the victim's prompt; timing: it answers sooner",
              FindingKind.CROSS_TENANT_CACHE_HIT, checks=("prefix-cache", "timing"),
              releases=(Releases(Engine.VLLM, fixed_in="0.9.0"),)),
    EngineBug("SGLang #26747 → #37058 → #38577, #37160; LMCache #4825", "a storage tier keyed without the tenant's "
              "namespace or cache salt: tenant B reads tenant A's pages back", {"storage_tier_ignores_salt": True},
              "the prefix-cache check with a cache salt per tenant", FindingKind.CROSS_TENANT_CACHE_HIT,
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
        route = run.target.shape.chosen.api.value if run.target.shape else run.target.config.api.value
        result.layers.append(prefix_layer(result, route))
        return result

    def plan(self, run: Run) -> Plan:
        a, ctx = run.config.audit, run.target
        return cache_plan(ctx.config.name, ctx.capacity, ctx.tenants, streaming=a.streaming, max_tokens=a.max_tokens,
                          run_id=run.run_id, fact_share=ctx.wiring.fact_share)


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


def prefix_layer(result: CheckResult, route: str) -> CacheVerdict:
    """The engine's prefix cache on the cache map: shared where another tenant's prompt was served from it
    (`cross_tenant_cache_hit`); per tenant where none was but an observer's own repeat (A, X, A) reported more cached
    tokens than its first send of the same prompt (the positive control); none seen where the engine counts cached
    tokens and the repeat reused nothing; undecided where it counts none (a counter that does not move proves
    nothing: llama.cpp #27148) or the repeats went unanswered.  Answers a cache in front served are no reading."""
    made = [s for s in result.steps if s.answer.served and s.answer.from_cache is None]
    crossed = sum(f.kind is FindingKind.CROSS_TENANT_CACHE_HIT for f in result.findings)
    firsts = {s.exchange: _cached(s) for s in made if s.step.role == "lead"}
    repeats = [(firsts[s.exchange], _cached(s)) for s in made
               if s.step.role == "probe" and s.step.boundary == REPEAT and s.exchange in firsts]
    counted = [(first, again) for first, again in repeats if first is not None and again is not None]
    reused = sum(again > first for first, again in counted)
    control = f"an observer's own repeat reused more than its first send in {reused} of {len(repeats)} repeats"
    if crossed:
        return CacheVerdict("prefix", route, LayerState.SHARED, f"{crossed} cross-tenant hits; {control}",
                            len(repeats))
    if not counted:
        why = "the engine reported no cached tokens" if repeats else "no repeat was answered by the engine"
        return CacheVerdict("prefix", route, LayerState.UNDECIDED, why, len(repeats))
    state = LayerState.PER_TENANT if reused else LayerState.NONE_SEEN
    return CacheVerdict("prefix", route, state, control, len(repeats))


def _cached(step: StepResult) -> int | None:
    usage = step.answer.usage
    return usage.cached_tokens if usage is not None and not step.answer.implausible_usage else None
