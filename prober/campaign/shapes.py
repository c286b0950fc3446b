"""Which probe shape makes this target's model show what it attends over: measured, not assumed.

Before the first canary-bearing prompt of a run, each tenant sends one short prompt of its own canaries in a
shape (prober/prompts/shape.py); the answers are scanned like any other (another tenant's canary there is a
finding too).  The first shape that brings every tenant's own canary back is chosen at once; otherwise the one
that brought back the most, the earlier on a tie.  Where none brought any back, content checks cannot observe
a leak on this target: the run says it is blind rather than clean.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from prober.campaign.results import ShapeChoice, ShapeTrial, StepResult
from prober.prompts.shape import Shape

# Short: a control only has to show whether the model repeats a code it was given, and runs before every
# campaign.  One canary unit of a 128-token page fits.
CONTROL_TOKENS = 160
CONTROL_ANSWER_TOKENS = 64  # enough for a token canary (~20 tokens) behind whatever the model says first

Trial = Callable[[Shape, str], Awaitable[StepResult]]  # one tenant's control prompt in one shape


def planned_tokens(shapes: Sequence[Shape], tenants: Sequence[str]) -> int:
    """The most a choice can cost: every shape tried by every tenant."""
    return len(shapes) * len(tenants) * CONTROL_TOKENS


async def choose_shape(shapes: Sequence[Shape], tenants: Sequence[str], trial: Trial,
                       unusable: type[Exception], stopped: Callable[[], bool]) -> ShapeChoice:
    """`unusable`: what `trial` raises when a shape cannot be tried at all (its route has no way to count).
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
        if tried.controls and tried.echoed == len(tried.controls):
            break
    best = max(trials, key=lambda t: (t.echoed / len(t.controls) if t.controls else -1.0, -trials.index(t)),
               default=None)
    return ShapeChoice(best.shape if best and best.controls else shapes[0], trials)
