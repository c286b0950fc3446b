"""The prefix-cache check: does another tenant's prompt come back from the cache (the observer resends the victim's
nonce-led prompt), and does a repeat carry what ran in between (A, X, A)?  Cached tokens are explained against
everything sent before (prober/probing/cached.py)."""

from __future__ import annotations

from prober.checks.base import Run
from prober.checks.plans import LONG_PROMPTS, PlanCheck
from prober.probing.plan import Plan, cache_plan


class PrefixCacheCheck(PlanCheck):
    name = "prefix-cache"
    about = "another tenant's prompt resent: served from a shared prefix cache, or a repeat carrying another's"
    every = 21_600.0
    sees_with = LONG_PROMPTS

    def plan(self, run: Run) -> Plan:
        a, ctx = run.config.audit, run.target
        return cache_plan(ctx.config.name, ctx.capacity, ctx.tenants, streaming=a.streaming, max_tokens=a.max_tokens,
                          run_id=run.run_id, fact_share=ctx.wiring.fact_share)
