"""The boundary campaign: prompts just below, at and above the KV pool and the advertised context, each tenant's
canaries primed, another tenant's probe after them (prober/probing/plan.py `make_plan`)."""

from __future__ import annotations

from prober.checks.base import Run
from prober.checks.plans import LONG_PROMPTS, PlanCheck
from prober.probing.plan import Plan, make_plan


class CampaignCheck(PlanCheck):
    name = "campaign"
    about = "the boundary campaign: token-exact prompts below, at and above the KV pool and the advertised context"
    every = 21_600.0
    sees_with = LONG_PROMPTS
    survey = True  # plans from a fresh survey: the capacity may have changed

    def plan(self, run: Run) -> Plan:
        a, ctx = run.config.audit, run.target
        return make_plan(ctx.config.name, ctx.capacity, ctx.tenants, streaming=a.streaming, concurrent=a.concurrent,
                         rounds=a.rounds, max_tokens=a.max_tokens, run_id=run.run_id, fact_share=ctx.wiring.fact_share)
