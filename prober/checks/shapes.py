"""Which probe shape makes this target's model show what it attends over: measured, not assumed (the `shapes`
check).

Before the first canary-bearing prompt of a run, each tenant sends one short prompt of its own canaries in a
shape (prober/prompts/shape.py); the answers are scanned like any other (another tenant's canary there is a
finding too).  The first shape that brings every tenant's own canary back is chosen at once; otherwise the one
that brought back the most, the earlier on a tie.  Where none brought any back, content checks cannot observe
a leak on this target: the run says it is blind rather than clean.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from prometheus_client import CollectorRegistry, Gauge

from prober.checks.base import Check, ResultMetrics, Run
from prober.config.schema import ProberConfig
from prober.domain.errors import BuildError, CountError
from prober.probing.context import record
from prober.probing.events import CheckDone
from prober.probing.plan import Aim, Plan, Planned, Step, acceptance_limit
from prober.probing.planting import ASKED
from prober.probing.results import CheckResult, ShapeChoice, ShapeResult, ShapeTrial, StepResult
from prober.prompts.shape import Layout, Shape

# Short: a control only has to show whether the model repeats a code it was given, and runs before every
# campaign.  One canary unit of a 128-token page fits.
CONTROL_TOKENS = 160
CONTROL_ANSWER_TOKENS = 64  # enough for a token canary (~20 tokens) behind whatever the model says first

Trial = Callable[[Shape, str], Awaitable[StepResult]]  # one tenant's control prompt in one shape


def planned_tokens(shapes: Sequence[Shape], tenants: Sequence[str]) -> int:
    """The most a choice can cost: every shape tried by every tenant."""
    return len(shapes) * len(tenants) * CONTROL_TOKENS


Unusable = type[Exception] | tuple[type[Exception], ...]


async def choose_shape(shapes: Sequence[Shape], tenants: Sequence[str], trial: Trial, unusable: Unusable,
                       stopped: Callable[[], bool], *, every_shape: bool = False) -> ShapeChoice:
    """`unusable`: what `trial` raises when a shape cannot be tried at all (its route has no way to count, its
    control cannot be built behind the path).  `every_shape`: go on past the first shape that brings every canary
    back (the choice is the same), so that each shape's controls re-check what they found before.
    Stops early once `stopped()`, or once every control so far went unanswered (no answer and no refusal: the
    target does not answer, whatever the shape)."""
    trials: list[ShapeTrial] = []

    def silent() -> bool:
        controls = [c for t in trials for c in t.controls]
        return bool(controls) and not any(c.answer.served or c.answer.refused for c in controls)

    for shape in shapes:
        if stopped() or silent():
            break
        tried = ShapeTrial(shape)
        trials.append(tried)
        try:
            for tenant in tenants:
                if stopped() or silent():
                    break
                tried.controls.append(await trial(shape, tenant))
        except unusable as exc:
            tried.error = str(exc)
            continue
        if tried.controls and tried.echoed == len(tried.controls) and not every_shape:
            break
    best = max(trials, key=lambda t: (t.echoed / len(t.controls) if t.controls else -1.0, -trials.index(t)),
               default=None)
    return ShapeChoice(best.shape if best and best.controls else shapes[0], trials)


class ShapesCheck(Check):
    name = "shapes"
    about = "which probe shape (route and layout) brings this target's own canaries back: the others take it"
    every = 21_600.0
    survey = True  # the model behind the URL may have changed

    def metrics(self, registry: CollectorRegistry) -> ShapeMetrics:
        return ShapeMetrics(registry)

    def planned(self, run: Run) -> Planned:
        shapes, tenants = run.target.config.shapes, run.target.tenants
        requests = len(shapes) * len(tenants)
        return Planned.of(planned_tokens(shapes, tenants), requests, requests * answer_tokens(run.config))

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        """Every shape: a control's finding at any shape is re-checked by its next run (a daemon's job)."""
        return await self.choose(run, every_shape=True)

    async def choose(self, run: Run, *, every_shape: bool) -> ShapeResult:
        ctx = run.target
        capacity = ctx.capacity
        limit, page = acceptance_limit(capacity), capacity.page_size.value if capacity.page_size else None
        result = ShapeResult(check=self.name)
        controls = Plan(ctx.config.name, [], run_id=run.run_id)  # token canaries: do codes come back at all?

        async def trial(shape: Shape, tenant: str) -> StepResult:
            route = await ctx.routes.get(shape.api)
            # Short, whatever the path adds in front, and below the limit with it.
            step = Step(id=f"{run.run_id}c{shape.name}-{tenant}", role="control", tenant=tenant,
                        length=CONTROL_TOKENS, stream=False, expect_served=True, boundary=f"shape:{shape.name}",
                        max_tokens=answer_tokens(run.config), aim=Aim.OWN, ceiling=limit - 1 if limit else None)
            cue = shape.layout is Layout.CUE
            built = await ctx.planter.prompt(step, ASKED["quote"], route, controls, page=page, cue=cue, lead=cue)
            judged = await ctx.send_judged(step, built, route, check=self.name)
            record(judged, result, run.on_event)
            return judged

        result.choice = ctx.shape = await choose_shape(ctx.config.shapes, ctx.tenants, trial,
                                                       (CountError, BuildError),
                                                       stopped=lambda: ctx.wiring.stop_reason() is not None,
                                                       every_shape=every_shape)
        result.choice.run_id = run.run_id
        return result


def answer_tokens(config: ProberConfig) -> int:
    """A control's answer: enough for a code behind whatever the model says first, no more than a probe gets."""
    return min(CONTROL_ANSWER_TOKENS, config.audit.max_tokens)


async def shaped(run: Run, result: CheckResult) -> None:
    """Before a check's first canary-bearing request: the probe shape, chosen now where none was, at the first shape
    that brings every canary back (its controls join `result`).  A choice whose controls drew a finding is made again,
    at every shape, by the next run (a daemon's next job): that is the re-check those findings wait for, where the
    `shapes` job is off."""
    shape = run.target.shape
    again = shape is not None and shape.faulted and shape.run_id != run.run_id
    if shape is None or again:
        chosen = await ShapesCheck().choose(run, every_shape=again)
        run.on_event(CheckDone(run.target.config.name, chosen))  # the `shapes` check's result, in another's run
        result.steps += chosen.steps


class ShapeMetrics(ResultMetrics):
    """The last choice of a target's probe shape: which one its requests take, and how each tried shape did."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.echoed = Gauge("leakprobe_probe_shape_own_echo_ratio", "Of the last probe-shape choice's control prompts "
                            "in each shape tried, the share that brought their own canary back.", ["target", "shape"],
                            registry=registry)
        self.chosen = Gauge("leakprobe_probe_shape_info", "1 for the probe shape a target's requests take (route and "
                            "layout, measured before each campaign).", ["target", "shape"], registry=registry)
        self.series = [self.echoed, self.chosen]

    def observe(self, target: str, result: CheckResult) -> None:
        choice = result.choice if isinstance(result, ShapeResult) else None
        for trial in choice.trials if choice else ():
            self.chosen.labels(target, trial.shape.name).set(int(choice is not None and trial.shape == choice.chosen))
            if trial.controls:
                self.echoed.labels(target, trial.shape.name).set(trial.echoed / len(trial.controls))
