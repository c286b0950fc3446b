"""How long a run against one target may take when no deadline is given: generous for a slow engine, finite for
one that stalls or never finishes.  Each part is its requests' prompt tokens at PREFILL_FLOOR a second and their
`max_tokens` at DECODE_FLOOR a second (the floors each request's own deadline assumes: prober/targets/bounds.py);
a run adds DEADLINE_BASE_S once.  The survey has its own allowance, ahead of the rest: what follows is only
known once it has learned the target's capacity.
"""

from __future__ import annotations

from collections.abc import Sequence

from prober.campaign.plan import Plan, pairs
from prober.campaign.shapes import CONTROL_ANSWER_TOKENS, CONTROL_TOKENS
from prober.campaign.slots import USUAL_SLOTS
from prober.campaign.timing import planned_requests, planned_tokens
from prober.config import CrosstalkSettings, ProberConfig, SlotSettings, TimingSettings
from prober.prompts.shape import Shape
from prober.targets.bounds import DECODE_FLOOR, PREFILL_FLOOR

SURVEY_ALLOWANCE_S = 300.0  # reachability, introspection, finding a tokenizer
DEADLINE_BASE_S = 120.0


def plan_seconds(plan: Plan) -> float:
    steps = [step for exchange in plan.exchanges for step in exchange.steps]
    return plan.tokens / PREFILL_FLOOR + sum(step.max_tokens for step in steps) / DECODE_FLOOR


def shape_seconds(shapes: Sequence[Shape], tenants: Sequence[str]) -> float:
    """The probe-shape choice at its longest: every shape's control from every tenant."""
    return len(shapes) * len(tenants) * (CONTROL_TOKENS / PREFILL_FLOOR + CONTROL_ANSWER_TOKENS / DECODE_FLOOR)


def timing_seconds(timing: TimingSettings, tenants: Sequence[str]) -> float:
    """One request at a time, each asking for one token."""
    return planned_tokens(timing, tenants) / PREFILL_FLOOR + planned_requests(timing, tenants) / DECODE_FLOOR


def slots_seconds(slots: SlotSettings, tenants: Sequence[str]) -> float:
    """The configured width, or llama.cpp's usual four, one request at a time."""
    requests = 4 * len(pairs(list(tenants))) * (slots.width or USUAL_SLOTS)
    return requests * (slots.tokens / PREFILL_FLOOR + slots.max_tokens / DECODE_FLOOR)


def crosstalk_seconds(crosstalk: CrosstalkSettings) -> float:
    """One concurrent burst."""
    return crosstalk.max_tokens / DECODE_FLOOR


def isolation_seconds(config: ProberConfig, tenants: Sequence[str]) -> float:
    """The timing check, the idle-slot check and the cross-talk burst, where the config runs them in audits."""
    return ((timing_seconds(config.timing, tenants) if config.timing.audit else 0.0)
            + (slots_seconds(config.slots, tenants) if config.slots.audit else 0.0)
            + (crosstalk_seconds(config.crosstalk) if config.crosstalk.audit else 0.0))
