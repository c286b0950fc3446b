"""Idle slots: does a cold prompt land in a slot that still holds another tenant's conversation?

llama.cpp's server keeps each slot's last conversation for its prompt cache (`--cache-ram` and
`--cache-idle-slots`, on by default).  In llama.cpp #27148 a fresh request for an unrelated prompt was served from
a slot that still held an earlier, finished conversation, and the model continued that conversation, with
`cached_tokens` 0 in every corrupted answer.  So, for each ordered tenant pair: the victim leaves a conversation
in every slot (canary prompts sent one at a time), then the observer sends as many prompts of its own that share
no prefix with them, one at a time; then the victim fills every slot again and the observer sends as many at
once.  Every answer is scanned.  The victim's canary in
the observer's answer is a `cross_tenant_echo` like any other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from secrets import token_hex

from prober.capacity import Capacity
from prober.capacity.known_bugs import Releases
from prober.checks.base import Check, Run
from prober.checks.bugs import EngineBug
from prober.checks.shapes import shaped
from prober.config.schema import ProberConfig
from prober.config.sections import IdleSlotSettings
from prober.domain.types import FindingKind
from prober.probing.context import tell
from prober.probing.plan import Aim, Plan, Planned, Step, pairs
from prober.probing.planting import ASKED, PRIME_INSTRUCTION
from prober.probing.results import CheckResult, StepResult
from prober.targets.api import Engine

Send = Callable[[Step], Awaitable[StepResult]]  # plant, send and judge one request
BOUNDARY = "idle-slot"


USUAL_SLOTS = 4  # llama.cpp's slots when `--parallel` is left to choose


def width_of(settings: IdleSlotSettings, capacity: Capacity) -> int | None:
    """How many slots to fill: the configured number, else the engine's own (llama.cpp reports `total_slots`), else,
    where the engine is not known at all (its introspection hidden behind a gateway), llama.cpp's usual number, as
    it may be one; None for a known engine without slots (nothing to check)."""
    known = capacity.slots.value if capacity.slots else None
    return settings.width or known or (USUAL_SLOTS if capacity.engine is None else None)


def planned_tokens(settings: IdleSlotSettings, tenants: Sequence[str], capacity: Capacity) -> int:
    """Per ordered pair: the victim's fill before each of the observer's two rounds."""
    return len(pairs(list(tenants))) * 4 * (width_of(settings, capacity) or 0) * settings.tokens


async def check_idle_slots(run: Send, tenants: Sequence[str], settings: IdleSlotSettings, *, width: int,
                           run_id: str = "") -> CheckResult:
    result = CheckResult(check=IdleSlotsCheck.name)

    def step(kind: str, tenant: str, i: int) -> Step:
        return Step(id=f"{run_id}sl{len(result.steps) + i + 1:03d}-{kind}", role="prime" if kind == "fill" else "probe",
                    tenant=tenant, length=settings.tokens, stream=False, expect_served=True, boundary=BOUNDARY,
                    max_tokens=settings.max_tokens, aim=Aim.NONE)

    async def fill(victim: str) -> None:
        for _ in range(width):  # one at a time: each request takes the slot idle longest
            result.steps.append(await run(step("fill", victim, 0)))

    for victim, observer in pairs(list(tenants)):
        await fill(victim)
        for _ in range(width):
            result.steps.append(await run(step("cold", observer, 0)))
        await fill(victim)
        burst = [step("burst", observer, i) for i in range(width)]
        result.steps += await asyncio.gather(*(run(s) for s in burst))
    result.errors = [f"{s.step.id}: {s.answer.error or 'not served'}" for s in result.steps if not s.answer.served]
    return result


# The public engine bugs it catches, as the reference engine reproduces each (the bug table: docs/testbed.md).
BUGS = (
    EngineBug("llama.cpp #27148, #27624", "a fresh request for an unrelated prompt served from a slot that still "
              "holds an earlier, finished conversation, with 0 tokens reported cached",
              {"idle_slot_keeps_conversation": True},
              "the idle-slot check: the victim's conversations in every slot, then the observer's cold prompts one "
              "at a time and all at once", FindingKind.CROSS_TENANT_ECHO, checks=("idle-slots",),
              engine={"mode": "monolithic", "slots": 2, "context_length": 4_096, "pool_tokens": 8_192},
              audit={"capacity": {"slots": 2}}, releases=(Releases(Engine.LLAMACPP),)),
)


class IdleSlotsCheck(Check):
    name = "idle-slots"
    about = "a cold prompt of one tenant served from a slot that still holds another tenant's conversation"
    every = 21_600.0
    bugs = BUGS

    def in_audit(self, config: ProberConfig) -> bool:
        return config.idle_slots.audit

    def planned(self, run: Run) -> Planned:
        settings, tenants = run.config.idle_slots, run.target.tenants
        width = width_of(settings, run.target.capacity)
        if width is None:
            return Planned.moot_because(f"{run.target.capacity.engine} serves without a fixed set of slots")
        requests = len(pairs(tenants)) * 4 * width
        return Planned.of(planned_tokens(settings, tenants, run.target.capacity), requests,
                          requests * settings.max_tokens)

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        """Every prompt led by a fresh nonce, so that none shares a prefix with anything a slot holds (the victim's
        take a slot each)."""
        ctx, settings = run.target, run.config.idle_slots
        width = width_of(settings, ctx.capacity)
        if width is None:
            return CheckResult(check=self.name)
        shapes = CheckResult(check=self.name)
        await shaped(run, shapes)
        route, page = await ctx.route(), ctx.surveyed.page if ctx.surveyed else None
        plan = Plan(ctx.config.name, [], run_id=run.run_id)

        async def send(step: Step) -> StepResult:
            ask = ASKED["quote"] if step.role == "probe" else PRIME_INSTRUCTION
            built = await ctx.planter.prompt(step, ask, route, plan, page=page, cue=False, nonce=token_hex(6))
            judged = await ctx.send_judged(step, built, route, check=self.name)
            tell(judged, self.name, run.on_event)  # any slot may hold any tenant's conversation
            return judged

        result = await check_idle_slots(send, ctx.tenants, settings, width=width, run_id=run.run_id)
        result.steps[:0] = shapes.steps
        return result
