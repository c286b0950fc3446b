"""The sentinel: everyday-sized exchanges far from any boundary, the daemon's every minute (never an audit's)."""

from __future__ import annotations

from prober.checks.base import Run
from prober.checks.plans import PlanCheck
from prober.config.schema import ProberConfig
from prober.probing.plan import Plan, sentinel_plan


class SentinelCheck(PlanCheck):
    name = "sentinel"
    about = "everyday-sized prompts from each tenant in turn, far from any boundary"
    every = 60.0

    def in_audit(self, config: ProberConfig) -> bool:
        return False

    def plan(self, run: Run) -> Plan:
        sentinel, ctx = run.config.daemon.sentinel, run.target
        return sentinel_plan(ctx.config.name, ctx.tenants, tokens=sentinel.tokens, max_tokens=sentinel.max_tokens,
                             run_id=run.run_id, retention_s=sentinel.retention, fact_share=ctx.wiring.fact_share)
