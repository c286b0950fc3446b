"""The envelope's verdict behind a path whose prefix varies per request, as policy: which answers at the limit the
path leaves undecided (`path_jitter`), which still show the engine serving what it must refuse, and what the path's
range keeps of the readings it is given."""

from __future__ import annotations

import asyncio

import pytest

from prober.domain.evidence import PathRange
from prober.domain.types import FindingKind, Severity
from prober.probing.envelope import check_answer
from prober.probing.path import DRIFT, KEPT, PathOverhead, measure
from prober.probing.plan import Aim, Step
from prober.probing.results import StepResult
from prober.prompts.counter import LocalCounter
from prober.targets.api import Api
from prober.targets.base import Prompt
from prober.targets.result import Completion, Cut, ErrorKind, TargetError, Usage

pytestmark = pytest.mark.unit

LIMIT = 4_090  # the shortest prompt a correct engine refuses
VARYING = PathRange(1_790, 1_803, LIMIT)  # the path adds 1,790 to 1,803 tokens
FIXED = PathRange(1_796, 1_796, LIMIT)
REFUSAL = TargetError(ErrorKind.REFUSED, f"Input length ({LIMIT + 1} tokens) exceeds the maximum allowed length", 400)


def step(length: int, *, served: bool, aim: Aim = Aim.LENGTH) -> Step:
    return Step(id="x001-probe", role="probe", tenant="tenant-b", length=length, stream=False, expect_served=served,
                boundary="edge", aim=aim)


def served(usage: int) -> Completion:
    return Completion(200, "an answer", usage=Usage(prompt_tokens=usage, completion_tokens=3), finish_reason="stop")


def kinds(step: Step, answer: Completion, path: PathRange) -> dict[FindingKind, Severity]:
    return {f.kind: f.severity for f in check_answer(step, step.length, answer, path)}


def test_served_over_the_limit_where_the_path_added_less_is_undecided_not_a_page() -> None:
    # Built for the least the path adds (1,790): the engine counted 4,085, under its limit, so it was right to serve.
    found = check_answer(step(LIMIT, served=False), LIMIT, served(LIMIT - 5), VARYING)
    assert [(f.kind, f.severity) for f in found] == [(FindingKind.PATH_JITTER, Severity.INFO)]
    assert found[0].evidence == (PathRange(1_790, 1_803, LIMIT, seen=LIMIT - 5),)


@pytest.mark.parametrize("usage", [LIMIT, LIMIT + 40, 1])  # at the limit, over it, a placeholder's count
def test_served_with_a_count_at_the_limit_or_none_a_path_explains_is_still_boundary_accepted(usage: int) -> None:
    assert kinds(step(LIMIT, served=False), served(usage), VARYING)[FindingKind.BOUNDARY_ACCEPTED] is Severity.HIGH


def test_refused_at_the_limit_on_a_varying_path_is_undecided_and_observed() -> None:
    refused = Completion(400, error=REFUSAL)
    near = step(LIMIT - 1, served=True)
    found = check_answer(near, LIMIT - 1, refused, VARYING)
    assert [f.kind for f in found] == [FindingKind.PATH_JITTER]
    result = StepResult(step=near, exchange="x001", target="t", sent_tokens=LIMIT - 1, counted=True, answer=refused,
                        canary_ids=[], findings=found)
    assert result.observed and result.undecided


@pytest.mark.parametrize(("length", "path"), [(LIMIT - 50, VARYING), (LIMIT - 1, FIXED)])
def test_a_refusal_beyond_the_paths_width_or_behind_a_fixed_path_is_unexpected(length: int, path: PathRange) -> None:
    refused = Completion(400, error=REFUSAL)
    found = check_answer(step(length, served=True), length, refused, path)
    assert [f.kind for f in found] == [FindingKind.UNEXPECTED_REFUSAL]
    assert not StepResult(step=step(length, served=True), exchange="x", target="t", sent_tokens=length, counted=True,
                          answer=refused, canary_ids=[], findings=found).observed


def test_an_in_band_refusal_the_path_may_have_caused_is_no_warning() -> None:
    in_band = Completion(200, error=REFUSAL)
    found = kinds(step(LIMIT - 1, served=True), in_band, VARYING)
    assert found == {FindingKind.PATH_JITTER: Severity.INFO, FindingKind.STREAM_ERROR: Severity.INFO}


def test_an_everyday_prompt_the_engine_counted_over_the_limit_is_boundary_accepted() -> None:
    """A path whose prefix is as long as the pool (a long operator prompt before a small KV pool) puts every request
    over the limit: an engine that serves one is wrong, whatever the plan aimed at."""
    everyday = step(160, served=True, aim=Aim.NONE)
    assert kinds(everyday, served(LIMIT + 200), FIXED) == {FindingKind.BOUNDARY_ACCEPTED: Severity.HIGH}
    assert kinds(everyday, served(LIMIT - 200), FIXED) == {}


def test_the_paths_range_is_what_prompts_are_built_for_and_readings_keep_it_current() -> None:
    path = PathOverhead.measured(Api.CHAT, {"tenant-a": [1_796, 1_799], "tenant-b": [1_801]})
    assert (path.aimed("tenant-a", must_fit=True), path.aimed("tenant-a", must_fit=False)) == (1_799, 1_796)
    assert path.high("tenant-c") == 1_801 and path.low("tenant-c") == 1_796  # unmeasured: every tenant's readings
    assert path.observe("tenant-a", 1_803) and path.spread("tenant-a") == 7
    assert not path.observe("tenant-a", 1_803 + DRIFT + 1)  # an engine's count no path explains
    assert not path.observe("tenant-a", 1)  # a placeholder's
    assert not path.observe("tenant-c", 1_800)  # a tenant never measured gets no readings of its own
    for _ in range(KEPT):
        path.observe("tenant-a", 1_800)
    assert path.low("tenant-a") == path.high("tenant-a") == 1_800  # the latest KEPT: a path can change
    assert not path.varying  # each tenant's readings agree now (tenants may differ: a per-tenant prompt)


def test_a_target_that_never_answers_is_measured_once_per_tenant_not_four_times() -> None:
    """The path's measurement stops at a tenant's first answer without usage: against a target that never answers,
    each of the four readings would be cut at its bound, holding the survey for minutes."""
    sent: list[str] = []

    async def send(tenant: str, prompt: Prompt) -> Completion:
        sent.append(tenant)
        return Completion(None, error=TargetError(ErrorKind.TIMEOUT, "no answer within 2.8 s", cut=Cut.DEADLINE))

    path = asyncio.run(measure(Api.CHAT, LocalCounter(len), ["tenant-a", "tenant-b"], send))
    assert sent == ["tenant-a", "tenant-b"] and path.problem and "no answer" in path.problem, (sent, path)
