"""Running a plan's exchanges on a target: each built behind the path, sent as its tenants (one after another, or
together), judged, recorded into the check's result; the engine's counters read around each and decided once the
plan ends.  What the boundary campaign, the prefix-cache check and the sentinel share (prober/checks).

A plan stops between exchanges, and says why (also in the result's errors), once the daemon is stopping, the run's
deadline (prober/targets/bounds.py) has passed, or the circuit breaker opens: `breaker` answers in a row that could
not be observed.  An exchange that cannot be built behind the path (a one-page prime behind a longer system prompt)
is skipped and said, not failed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from secrets import token_hex

from prober.domain.errors import BuildError
from prober.domain.types import ProbeContext
from prober.probing.context import TargetContext, record
from prober.probing.counters import CounterEvidence
from prober.probing.events import Listener, Observed, PlanReady
from prober.probing.plan import Exchange, Plan, Step
from prober.probing.planting import PRIME_INSTRUCTION, instruction
from prober.probing.results import CheckResult, StepResult
from prober.probing.routes import Route
from prober.prompts import BuiltPrompt
from prober.prompts.shape import Layout
from prober.targets.telemetry import window


async def run_plan(ctx: TargetContext, plan: Plan, result: CheckResult, on_event: Listener) -> str | None:
    """Every exchange of `plan` in order; returns why it stopped early, if it did."""
    on_event(PlanReady(plan))
    result.planned = plan.requests
    counted = CounterEvidence()
    try:
        result.stopped = await _exchanges(ctx, plan, result, on_event, counted)
        return result.stopped
    finally:
        result.notes += counted.notes()
        result.planned -= sum(len(e.steps) for e in plan.exchanges if e.id in result.skipped)
        result.none_built(len(plan.exchanges))
        for finding in await ctx.decide_counters(counted, on_event, check=result.check):
            named = next((s for s in result.steps if s.step.id == finding.record_id), None)
            if named is not None:
                named.findings.append(finding)
        result.errors += counted.undecided


async def _exchanges(ctx: TargetContext, plan: Plan, result: CheckResult, on_event: Listener,
                     counted: CounterEvidence) -> str | None:
    unobserved = 0  # in a row
    answered: dict[str, list[StepResult]] = {}  # by exchange id: what its requests came to
    for exchange in plan.exchanges:
        stop = ctx.wiring.stop_reason() or (f"circuit breaker: {unobserved} answers in a row could not be observed"
                                            if unobserved >= ctx.config.breaker else None)
        if stop:
            result.errors.append(f"stopped before {exchange.id}: {stop}")
            return stop
        # Only a refusal makes a repeat moot: after a leak, repeats still show which directions leak and give the
        # engine's counters their windows.
        if exchange.unless_decided is not None and (
                why := decided(answered.get(exchange.unless_decided, []), exchange.probe)) is not None and why.refused:
            unsent(result, on_event, exchange, exchange.probe, len(exchange.steps),
                   f"{exchange.id} ({exchange.probe.boundary}) not sent: {exchange.unless_decided} decided it: {why}",
                   why)
            continue
        sent = len(result.steps)
        try:
            await _exchange(ctx, exchange, result, on_event, plan, counted)
        except BuildError as exc:
            result.skip(exchange.id, BuildError(f"{exchange.probe.boundary}: {exc}"), ctx.routes.paths,
                        (exchange.victim, exchange.observer))
            continue
        answered[exchange.id] = result.steps[sent:]
        for step in result.steps[sent:]:
            unobserved = 0 if step.observed else unobserved + 1
    return None


async def _exchange(ctx: TargetContext, exchange: Exchange, result: CheckResult, on_event: Listener, plan: Plan,
                    counted: CounterEvidence) -> None:
    route, page = await ctx.route(), ctx.surveyed.page if ctx.surveyed else None
    cue = ctx.shape is not None and ctx.shape.chosen.layout is Layout.CUE
    if exchange.same_text:
        prime = await ctx.planter.plain(exchange.prime, route, token_hex(6))
        probe = replace(prime, fresh_from=None)  # the victim's prompt again: not new when the observer sends it
    else:
        prime = await ctx.planter.prompt(exchange.prime, PRIME_INSTRUCTION, route, plan, page=page, cue=cue)
        probe = await ctx.planter.prompt(exchange.probe, instruction(exchange.probe, ctx.wiring.languages), route,
                                         plan, page=page, cue=cue, lead=cue)
    sends = [(exchange.prime, prime), *[await _around(ctx, step, route, probe) for step in exchange.between],
             (exchange.probe, probe), *[await _around(ctx, step, route, probe) for step in exchange.after]]
    if exchange.lead is not None:  # the observer's prompt before the victim's, then again: not new the second time
        sends = [(exchange.lead, probe), (exchange.prime, prime), (exchange.probe, replace(probe, fresh_from=None))]
    first = len(result.steps)
    await _sent(ctx, exchange, sends, route, result, on_event, counted)
    for step in exchange.then:
        if (why := decided(result.steps[first:], step)) is not None:
            unsent(result, on_event, exchange, step, 1,
                   f"{step.id} ({step.boundary}, {step.length:,} tokens) not sent: {why}", why)
            continue
        built = await ctx.planter.prompt(step, instruction(step, ctx.wiring.languages), route, plan, page=page,
                                         cue=cue, lead=cue)
        await _sent(ctx, exchange, [(step, built)], route, result, on_event, counted)


async def _around(ctx: TargetContext, step: Step, route: Route, probe: BuiltPrompt) -> tuple[Step, BuiltPrompt]:
    """A step around the probe: filler, a canary-free prompt led by a fresh nonce (no two share a page), that evicts
    a cache's first tier; else the observer's probe sent again."""
    return (step, await ctx.planter.plain(step, route, token_hex(6)) if step.role == "filler" else probe)


async def _sent(ctx: TargetContext, exchange: Exchange, sends: list[tuple[Step, BuiltPrompt]], route: Route,
                result: CheckResult, on_event: Listener, counted: CounterEvidence) -> None:
    """`sends` sent on the route they were built for (together where the exchange is concurrent), the engine's
    counters read around them, each answer judged and recorded."""
    async with window(ctx.telemetry, len(sends)) as engine:
        if exchange.concurrent and len(sends) > 1:
            sent = list(await asyncio.gather(*(ctx.send(step, built, route) for step, built in sends)))
        else:
            sent = [await ctx.send(step, built, route) for step, built in sends]
    # A failure the engine counted meanwhile is named on the observer's answer, else on the victim's.
    named = len(sent) - 1 if sent[-1][0].served or len(sent) == 1 else len(sent) - 2
    step, built = sends[named]
    read = counted.add(engine, request=step.id, tenant=step.tenant,
                       context=ProbeContext(built.tokens, step.boundary, sent[named][0].status),
                       unserved=sum(not answer.served for answer, _ in sent),
                       retried=any(answer.retried for answer, _ in sent))
    for (step, built), (answer, before) in zip(sends, sent, strict=True):
        judged = await ctx.judged(step, exchange.id, built, answer, route, check=result.check, before=before,
                                  engine=engine.evidence())
        record(judged, result, on_event, others=counterpart(exchange, step), counted=read)


@dataclass(frozen=True)
class Decided:
    """Why a further probe is not sent: `refused`, a probe no longer than it was refused (a correct engine refuses
    every longer prompt alike); else another tenant's data was found.  An engine that served an over-limit prompt
    without a leak is undecided: that is where its stale pages are read, so the probes go on."""

    refused: bool
    why: str

    def __str__(self) -> str:
        return self.why


def decided(steps: list[StepResult], then: Step) -> Decided | None:
    """Why a further probe (`Exchange.then`) would show nothing new after `steps`; None while the probes went
    unanswered, were served over the limit without a leak, or were all longer than it."""
    if any(f.victim_tenant not in (None, f.observer_tenant) for s in steps for f in s.findings):
        return Decided(False, "a leak between the tenants decides the exchange")
    refused = [s.step for s in steps if s.step.role == "probe" and s.answer.refused and s.step.length <= then.length]
    if refused:
        return Decided(True, f"{refused[0].boundary} ({refused[0].length:,} tokens) was refused, as is every longer "
                             "prompt")
    return None


def unsent(result: CheckResult, on_event: Listener, exchange: Exchange, step: Step, requests: int, note: str,
           why: Decided) -> None:
    """A probe (and the `requests` it stands for) not sent because the evidence decided it: out of what coverage
    counts, said in the notes; where a probe as long was refused, what its refusal would re-check, that one does."""
    result.planned -= requests
    result.notes.append(note)
    if why.refused:
        on_event(Observed(result.check, step.boundary, step.tenant, counterpart(exchange, step)))


def counterpart(exchange: Exchange, step: Step) -> tuple[str, ...]:
    """Whose canaries a step's answer could carry from this exchange: the observer's in the victim's answer (primed by
    an earlier exchange), the victim's in the observer's probe; none in a lead, sent before the victim's prime."""
    if step.role == "prime":
        return (exchange.observer,)
    return (exchange.victim,) if step.role == "probe" else ()
