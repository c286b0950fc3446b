"""The deploy gate's probes: the fewest that decide whether an engine leaks at its acceptance limit, for a pipeline
that must decide in minutes under a token ceiling (`leakprobe gate`, docs/gate.md).

One tenant's prime, as long as a correct engine serves (its canaries in every page it fills), then the other's
prompt just over the limit.  A correct engine refuses that prompt before prefilling it; the incident's engine serves
it, over the first tenant's leftovers: a `boundary_accepted` and, where the leftovers are read, a cross-tenant echo.
After them a short exchange that every engine serves shows whether the observer's own canary comes back at all: a
target that never says one is blind, and the gate cannot pass it.  One direction is enough to decide, at about twice
the pool in tokens; the boundary campaign keeps every direction, boundary and stream for the audit.  The checks of
the bug-table rows the engine's release is in join it in `leakprobe gate`.
"""

from __future__ import annotations

from pydantic import Field

from prober.checks.base import Run
from prober.checks.campaign import ONE_PAGE, boundaries, one_page
from prober.checks.plans import LONG_PROMPTS, PlanCheck, adder
from prober.config.sections import Strict
from prober.domain.errors import PlanError
from prober.probing.plan import Boundary, Plan, pairs, prime_length

SIGHT = "sight"  # the short exchange's boundary: served by every engine, its answer the observer's own canary
SIGHT_TOKENS = 512


class GateSettings(Strict):
    """The deploy gate's probes: one tenant's prime, the other's prompt just over the acceptance limit."""

    audit: bool = False
    """Run the gate's probes in `leakprobe audit` too (the boundary campaign covers them); `leakprobe gate` runs
    them whatever this says."""
    max_tokens: int = Field(default=64, ge=8, le=1024)
    """Completion tokens of the probe (enough to repeat a canary the engine should never have read)."""


class GateCheck(PlanCheck):
    name = "gate"
    about = "the deploy gate: one tenant's pool-filling prime, then another's prompt just over the acceptance limit"
    every = None  # the deploy pipeline's: the daemon runs it only where `daemon.schedule` names it
    docs = "gate.md"
    settings = GateSettings
    sees_with = LONG_PROMPTS

    def plan(self, run: Run) -> Plan:
        ctx = run.target
        settings = run.config.section(self.name, GateSettings)
        over = [b for b in boundaries(ctx.capacity) if not b.expect_served]
        if not over:
            raise PlanError("gate: no length over the acceptance limit is within the advertised context: nothing a "
                            "correct engine must refuse")
        victim, observer = pairs(ctx.tenants)[0]
        longest = prime_length(ctx.capacity)
        sight = Boundary(SIGHT, min(SIGHT_TOKENS, longest), True)
        plan = Plan(ctx.config.name, [sight, over[0]], run_id=run.run_id, fact_share=ctx.wiring.fact_share,
                    letter="g")
        add = adder(plan, ctx.capacity, settings.max_tokens)
        add(victim, observer, over[0], False, False)
        add(victim, observer, sight, False, False, first=min(one_page(ctx.capacity), longest), prime_label=ONE_PAGE,
            ask="quote")  # asked to quote: an answer that rewords may drop the canary it was asked for
        return plan
