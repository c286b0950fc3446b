"""Abort and retry: a tenant's long prompt abandoned mid-prefill, the same prompt from another tenant, that tenant's
own prompt, then the first tenant's retry; every answer checked for another tenant's canaries.

vLLM PR #56525: prefix-state hashes were published before the state behind them was written, so after a client
abort "the retry hits the aborted request's deepest published-but-never-written boundary hash" and decodes garbage.
vLLM #52234: a stale NIXL reference, after the producer had reused the blocks, returned the "previous prompt's
answer … for the new prompt" while `nixl_num_failed_transfers_total` stayed 0.  The garbage is whatever the pages
held, another tenant's KV where that tenant used them last.  So, for each ordered tenant pair (victim, observer),
prompts of one length, streamed:

1. the observer's own canary prompt: its answer shows that the observer's canaries come back, and its time to first
   token (about the prefill of that length) times the hang-up;
2. the observer's canary-free prompt P (led by a fresh nonce), hung up on at `hang_up` of that time, before its
   answer: mid-prefill, where the engine aborts it;
3. the victim sends P too: a prefix cache shared across tenants that holds P's pages as published, though nobody
   wrote them, gives the victim what they held (the observer's canaries, from step 1);
4. the victim's own canary prompt: the victim's canaries in the pages freed last;
5. the observer retries P: an engine that takes P's published pages as cached, though nobody wrote them, reads the
   victim's canaries there (`cross_tenant_echo`, the victim named).

A healthy engine computes what it did not cache, whoever else is using the endpoint (other users' aborts and retries
change which pages are reused, never what a correct engine computes), so nothing of another tenant's comes back;
the check makes no finding from counters or timing.  An abandoned request answered before the hang-up (prefill
faster than the client could hang up) is judged like any other, and the result says how many were.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from secrets import token_hex

from prober.capacity import Capacity
from prober.capacity.known_bugs import Releases
from prober.checks.base import Check, Run
from prober.checks.bugs import EngineBug
from prober.checks.shapes import shaped
from prober.config.schema import ProberConfig
from prober.config.sections import AbortRetrySettings
from prober.domain.errors import BuildError
from prober.domain.types import FindingKind
from prober.probing.context import TargetContext, record
from prober.probing.plan import Aim, Plan, Planned, Step, acceptance_limit, pairs
from prober.probing.planting import ASKED
from prober.probing.results import CheckResult, Sight, StepResult
from prober.probing.routes import Route
from prober.prompts import BuiltPrompt
from prober.prompts.shape import Layout
from prober.targets.api import Engine

BOUNDARY = "abort-retry"
STEPS = 5  # requests per ordered pair
# The most an engine is given to abort a request whose client hung up (a scheduler step, or the rest of a prefill
# that checks for aborts only at its end, as llama.cpp's within a batch); its next request waits as long.
ABORT_GRACE_S = 2.0


@dataclass(kw_only=True)
class AbortRetryResult(CheckResult):
    abandoned: int = 0  # hung up on before their answer came: mid-prefill, where the timing held
    answered_early: int = 0  # answered before the hang-up: their abort came too late

    @property
    def sight(self) -> Sight | None:
        """Its retries are canary-free (another tenant sends the same prompt): whether a canary in the context comes
        out is read from its answers to canary-bearing prompts."""
        planted = [s for s in self.steps if s.step.boundary == BOUNDARY and s.canary_ids and s.answer.served]
        return Sight(len(planted), sum(1 for s in planted if s.echoed)) if planted else None

    def summary(self) -> str:
        retries = sum(1 for s in self.steps if s.step.id.endswith("-retry"))
        return (f"abort and retry: {self.abandoned} prompts abandoned before their answer, {self.answered_early} "
                f"answered before the hang-up, {retries} retries, {len(self.findings)} findings")


def ceiling_of(settings: AbortRetrySettings, capacity: Capacity) -> int | None:
    """The most the engine may see of each prompt, the path's prefix included: what it serves with the answer's
    room."""
    limit = acceptance_limit(capacity)
    return None if limit is None else max(1, limit - 1 - settings.max_tokens)


def length_of(settings: AbortRetrySettings, capacity: Capacity) -> int:
    """Each prompt's own text: as configured, at most its ceiling."""
    ceiling = ceiling_of(settings, capacity)
    return settings.tokens if ceiling is None else min(settings.tokens, ceiling)


# The public engine bugs it catches, as the reference engine reproduces each (the bug table: docs/testbed.md).
BUGS = (
    EngineBug("vLLM PR #56525, #52234", "a prompt's cache entries published before its KV is written: after a "
              "client abort mid-prefill, the retry takes the never-written pages as cached and reads what they "
              "held, another tenant's KV", {"publishes_before_written": True},
              "the abort-and-retry check: the observer's prompt abandoned mid-prefill, the same prompt and then its "
              "own from the victim, the observer's retry", FindingKind.CROSS_TENANT_ECHO, checks=("abort-retry",),
              engine={"prefill_ms_per_1k_tokens": 100}, releases=(Releases(Engine.VLLM),)),
)


class AbortRetryCheck(Check):
    name = "abort-retry"
    about = "a prompt abandoned mid-prefill, then the same prompt from another tenant, then retried: nothing stale"
    every = 21_600.0
    bugs = BUGS

    def in_audit(self, config: ProberConfig) -> bool:
        return config.abort_retry.audit

    def planned(self, run: Run) -> Planned:
        settings = run.config.abort_retry
        requests = STEPS * len(pairs(run.target.tenants))
        return Planned.of(requests * length_of(settings, run.target.capacity), requests,
                          requests * settings.max_tokens)

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        ctx = run.target
        result = AbortRetryResult(check=self.name)
        await shaped(run, result)
        directions = pairs(ctx.tenants)
        for index, (victim, observer) in enumerate(directions, 1):
            exchange = f"{run.run_id}ar{index:02d}"
            try:
                await _pair(run, result, exchange, victim, observer)
            except BuildError as exc:
                result.skip(exchange, exc, ctx.routes.paths, (victim, observer))
        result.none_built(len(directions))
        if result.answered_early and not result.abandoned:
            result.notes.append(f"abort and retry: all {result.answered_early} prompts meant to be abandoned were "
                                "answered before the hang-up (prefill faster than the client could hang up): no "
                                "abort was tested; a longer `abort_retry.tokens` gives the hang-up time")
        return result


class _Sender:
    """One pair's requests: built for the target's route and probe shape, sent as their tenant, judged."""

    def __init__(self, ctx: TargetContext, route: Route, result: AbortRetryResult, run: Run, exchange: str) -> None:
        self.ctx, self.route, self.result, self.run, self.exchange = ctx, route, result, run, exchange
        self.plan = Plan(ctx.config.name, [], run_id=run.run_id, letter="a")

    def step(self, kind: str, tenant: str, length: int) -> Step:
        settings = self.run.config.abort_retry
        return Step(id=f"{self.exchange}-{kind}", role="probe" if kind in ("same", "retry") else "prime",
                    tenant=tenant, length=length, stream=True, expect_served=True, boundary=BOUNDARY,
                    max_tokens=settings.max_tokens, aim=Aim.OWN,
                    ceiling=ceiling_of(settings, self.ctx.capacity))

    async def planted(self, step: Step) -> BuiltPrompt:
        """A prompt of the tenant's canaries asking to quote them, led by a fresh nonce."""
        ctx = self.ctx
        cue = ctx.shape is not None and ctx.shape.chosen.layout is Layout.CUE
        page = ctx.surveyed.page if ctx.surveyed else None
        return await ctx.planter.prompt(step, ASKED["quote"], self.route, self.plan, page=page, cue=cue, lead=cue,
                                        nonce=token_hex(6))

    async def judged(self, step: Step, built: BuiltPrompt) -> StepResult:
        answer, before = await self.ctx.send(step, built, self.route)
        judged = await self.ctx.judged(step, self.exchange, built, answer, self.route, check=AbortRetryCheck.name,
                                       before=before)
        record(judged, self.result, self.run.on_event)
        return judged

    async def abandoned(self, step: Step, built: BuiltPrompt, prefill: float) -> None:
        """Sent and hung up on at `hang_up` of `prefill`, then left to the engine to abort, for as long as the rest of
        its prefill could take (at most `ABORT_GRACE_S`); judged like any other where it was answered first."""
        after = self.run.config.abort_retry.hang_up * prefill
        sent = await self.ctx.hang_up(step, built, self.route, after, min(ABORT_GRACE_S, prefill - after))
        if sent is None:
            self.result.abandoned += 1
            self.result.other_tokens += built.tokens
            return
        answer, before = sent
        self.result.answered_early += 1
        judged = await self.ctx.judged(step, self.exchange, built, answer, self.route, check=AbortRetryCheck.name,
                                       before=before)
        record(judged, self.result, self.run.on_event)


async def _pair(run: Run, result: AbortRetryResult, exchange: str, victim: str, observer: str) -> None:
    ctx, settings = run.target, run.config.abort_retry
    length = length_of(settings, ctx.capacity)
    send = _Sender(ctx, await ctx.route(), result, run, exchange)
    fill = send.step("fill", observer, length)
    timed = await send.judged(fill, await send.planted(fill))
    if not timed.answer.served:
        return  # no prefill time to hang up by (its error is the result's)
    prefill = timed.answer.ttft_s if timed.answer.ttft_s is not None else timed.answer.total_s
    abandon = send.step("abandon", observer, length)
    prompt = await ctx.planter.plain(abandon, send.route, token_hex(6))
    await send.abandoned(abandon, prompt, prefill)
    again = replace(prompt, fresh_from=None)  # sent before: not new when sent again
    await send.judged(send.step("same", victim, length), again)
    other = send.step("other", victim, length)
    await send.judged(other, await send.planted(other))
    await send.judged(send.step("retry", observer, length), again)
