"""The sentinel: everyday-sized exchanges far from any boundary, the daemon's every minute (never an audit's)."""

from __future__ import annotations

from prober.checks.base import Run
from prober.checks.plans import PlanCheck
from prober.config.schema import ProberConfig
from prober.probing.plan import Aim, Boundary, Plan, pairs

SENTINEL = "sentinel"
SENTINEL_CACHE = "sentinel-cache"


class SentinelCheck(PlanCheck):
    name = "sentinel"
    about = "everyday-sized prompts from each tenant in turn, far from any boundary"
    every = 60.0
    docs = "daemon.md"

    def in_audit(self, config: ProberConfig) -> bool:
        return False

    def plan(self, run: Run) -> Plan:
        sentinel, ctx = run.config.daemon.sentinel, run.target
        return sentinel_plan(ctx.config.name, ctx.tenants, tokens=sentinel.tokens, max_tokens=sentinel.max_tokens,
                             run_id=run.run_id, retention_s=sentinel.retention, fact_share=ctx.wiring.fact_share)


def sentinel_plan(target: str, tenants: list[str], *, tokens: int, max_tokens: int, run_id: str = "",
                  retention_s: float | None = None, fact_share: float = 0.0) -> Plan:
    """Everyday sizes, far from any boundary, a few hundred tokens per tenant: for each direction the
    observer first resends a canary-free prompt the victim has just sent (is the prefix cache shared?), then
    the victim sends a short canary-bearing prompt and the observer a probe of its own that asks to quote
    (does anything of the victim's reach the observer's answer: a session mix-up, a shared cache)."""
    everyday = Boundary(SENTINEL, tokens, True, aim=Aim.NONE)
    plan = Plan(target, [everyday], run_id=run_id, retention_s=retention_s, fact_share=fact_share)
    for d, (victim, observer) in enumerate(pairs(tenants)):
        for label, same_text in ((SENTINEL_CACHE, True), (SENTINEL, False)):
            plan.add(victim, observer, Boundary(label, tokens, True, aim=Aim.NONE), stream=False, concurrent=False,
                     same_text=same_text, prime_length=tokens, room=lambda _: max_tokens,
                     ask="quote" if same_text or d % 2 == 0 else "summarize")
    return plan
