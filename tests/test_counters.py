"""The engine's failure counters against other users' traffic, as statistics and policy: windows and a background
in this process, the background read from a `/metrics` on httpx's MockTransport.  (Against the reference engine
behind a gateway with other tenants' aborts, and on an engine that answers its aborts with HTTP 200:
tests/test_shared_endpoint.py and tests/test_engine_bugs.py.)"""

from __future__ import annotations

import itertools
import random

import httpx
import pytest

from prober.config.sections import CounterSettings
from prober.domain.evidence import Change, CounterTest
from prober.domain.types import FindingKind, ProbeContext, Severity
from prober.probing.counters import CounterEvidence, rate_test
from prober.targets import Transport
from prober.targets.telemetry import SOURCE, Background, EngineTelemetry, Reading, Window, incomparable
from tests.support.aio import run
from tests.support.mockhttp import send
from tests.support.policies import FAST

pytestmark = pytest.mark.unit

ABORTS = "sglang:num_aborted_requests_total"
VLLM_ABORTS = 'vllm:request_success_total{finished_reason="abort"}'
VLLM_TRANSFERS = "vllm:nixl_num_failed_transfers_total"


def window(rise: float, seconds: float = 0.05, problem: str | None = None) -> Window:
    return Window(2, {ABORTS: Change.between(10.0, 10.0 + rise)}, seconds, problem)


def background(events: int, seconds: float) -> Background:
    quiet = Background()
    quiet.add(seconds, seconds, {ABORTS: float(events)} if events else {})
    return quiet


def evidence(*windows: Window, unserved: int = 0) -> CounterEvidence:
    counted = CounterEvidence()
    for i, opened in enumerate(windows):
        counted.add(opened, request=f"x{i:03d}-probe", tenant="b", context=ProbeContext(4_097, "pool+1", 200),
                    unserved=unserved, retried=False)
    return counted


def test_an_idle_engine_that_aborts_answered_requests_is_found() -> None:
    counted = evidence(*(window(1) for _ in range(4)))
    (decision,) = counted.decide(background(0, 10.0), false_alarm=0.001)
    assert decision.found and decision.p_value < 1e-6
    (finding,) = counted.findings([decision])
    assert finding.kind is FindingKind.COUNTED_FAILURE and finding.severity is Severity.HIGH
    test = finding.evidence_of(CounterTest)
    assert test is not None and test.decisions == (decision,) and test.windows[0].excess == {ABORTS: 1.0}
    assert decision.own_events == 4 and "p = " in finding.excerpt


def test_other_users_aborts_at_their_usual_rate_are_not_a_finding() -> None:
    """Background at 0.1 aborts a second; 50 windows of 20 ms: one abort in them is what chance gives."""
    counted = evidence(window(1), *(window(0, 0.02) for _ in range(49)))
    (decision,) = counted.decide(background(1, 10.0), false_alarm=0.001)
    assert not decision.found and decision.p_value > 0.1
    assert counted.findings([decision]) == []


def test_the_false_alarm_rate_holds_under_a_poisson_background() -> None:
    """Simulated healthy endpoints: aborts at a random rate, in our windows and in the quiet stretches alike."""
    rng = random.Random(7)
    alarms = 0
    for _ in range(2_000):
        rate = rng.uniform(0.01, 2.0)
        own_seconds, quiet_seconds = rng.uniform(0.5, 60.0), rng.uniform(5.0, 60.0)
        own, quiet = poisson(rng, rate * own_seconds), poisson(rng, rate * quiet_seconds)
        alarms += rate_test(own, own_seconds, quiet, quiet_seconds) <= 0.001 / 5
    assert alarms <= 2  # 2,000 runs at 0.0002 each: 0.4 expected


def test_a_window_that_cannot_be_evidence_is_set_aside_and_said() -> None:
    counted = evidence(window(3, problem="before and after came from different engine processes"))
    counted.add(window(2), request="x9", tenant="a", context=ProbeContext(), unserved=0, retried=True)
    assert not counted.rose and len(counted.set_aside) == 2
    assert evidence(window(1), unserved=1).rose is False  # a refused request's own abort


def test_readings_from_two_replicas_or_a_restart_are_not_compared() -> None:
    before = Reading({ABORTS: 10.0}, 0.0, 1_700_000_000.0, 0, 0)
    assert incomparable(before, Reading({ABORTS: 12.0}, 1.0, 1_700_000_500.0, 1, 0)) is not None
    assert incomparable(before, Reading({ABORTS: 3.0}, 1.0, 1_700_000_000.0, 1, 0)) is not None
    assert incomparable(before, Reading({ABORTS: 12.0}, 1.0, 1_700_000_000.0, 1, 0)) is None


def test_the_bonferroni_family_is_every_failure_counter_the_engine_exposed() -> None:
    """vLLM with NIXL exposes two failure counters: a rise in one is tested at half the rate, whichever rose (a
    family of those that rose would be picked by the data); an engine that exposes one tests it at the whole rate."""
    exposing_two = Window(2, {VLLM_ABORTS: Change.between(3.0, 5.0), VLLM_TRANSFERS: Change.between(0.0, 0.0)}, 0.05)
    quiet = Background()
    quiet.add(10.0, 10.0, {})
    (decision,) = evidence(exposing_two).decide(quiet, false_alarm=0.001)
    assert decision.counter == VLLM_ABORTS and decision.alpha == pytest.approx(0.0005)
    (alone,) = evidence(window(2)).decide(background(0, 10.0), false_alarm=0.001)
    assert alone.alpha == pytest.approx(0.001)


def test_two_exposed_counters_keep_the_false_alarm_rate_of_the_run() -> None:
    """Simulated healthy vLLMs, both counters at random rates: a run reports either at most `false_alarm` of the
    time (0.02 here, so that 3,000 runs measure it)."""
    rng, alarms = random.Random(11), 0
    for _ in range(3_000):
        rates = {VLLM_ABORTS: rng.uniform(0.05, 2.0), VLLM_TRANSFERS: rng.uniform(0.05, 2.0)}
        own_s, quiet_s = rng.uniform(0.5, 20.0), rng.uniform(5.0, 30.0)
        own = {n: float(poisson(rng, r * own_s)) for n, r in rates.items()}
        quiet = Background()
        quiet.add(quiet_s, quiet_s, {n: float(poisson(rng, r * quiet_s)) for n, r in rates.items()})
        opened = Window(1, {n: Change.between(0.0, k) for n, k in own.items()}, own_s)
        alarms += any(d.found for d in evidence(opened).decide(quiet, false_alarm=0.02))
    assert alarms <= 0.02 * 3_000 * 1.25  # 60 at most expected; the test is conservative (discrete)


def metrics(sources: itertools.cycle[float], aborts: float = 7.0) -> httpx.MockTransport:
    """A `/metrics` whose reads are answered by the engine processes of `sources`, in turn."""
    def answer(_: httpx.Request) -> httpx.Response:
        text = f"{SOURCE} {next(sources)}\n{ABORTS} {aborts}\n"
        return send(200, text, content_type="text/plain")
    return httpx.MockTransport(answer)


async def read(transport: httpx.MockTransport, times: int) -> Background:
    async with Transport(FAST, http=transport) as through:
        telemetry = EngineTelemetry(through, "http://engine.test/metrics", None)
        for _ in range(times):
            await telemetry.read()
        return telemetry.background


def test_replicas_balanced_in_turn_each_give_background() -> None:
    """Behind a Kubernetes Service each read of `/metrics` goes to the next replica: no two reads in a row come from
    one process, yet each replica's reads, compared with its own last, are stretches with nothing of ours out."""
    balanced = run(read(metrics(itertools.cycle([1_700_000_000.0, 1_700_000_009.0])), 6))
    assert len(balanced.stretches) == 4 and balanced.seconds > 0
    one = run(read(metrics(itertools.cycle([1_700_000_000.0])), 3))
    assert len(one.stretches) == 2


def test_a_rise_with_no_background_is_undecided_and_says_why() -> None:
    """Every read of the counters failed (or came while a request of ours was out): nothing to test a rise against,
    so no p = 1 read as clean: the check is told why it could not decide."""
    def failing(_: httpx.Request) -> httpx.Response:
        return send(503, "upstream busy", content_type="text/plain")

    async def decide(quiet: bool) -> tuple[list[object], list[str]]:
        counted = evidence(window(2), window(1))
        async with Transport(FAST, http=httpx.MockTransport(failing)) as through:
            telemetry = EngineTelemetry(through, "http://engine.test/metrics", None)
            found = await counted.decided(telemetry, CounterSettings(quiet=0.05), quiet=quiet)
        return list(found), counted.undecided

    for quiet, said in ((True, "a quiet stretch of 0.1 s was read"), (False, "the run was stopping")):
        found, (why,) = run(decide(quiet))
        assert found == [] and f"{ABORTS} +3 in 0.1 s of leakprobe's windows" in why and said in why, why
        assert why.endswith("undecided")


def poisson(rng: random.Random, mean: float) -> int:
    count, total = 0, rng.expovariate(1.0)
    while total < mean:
        count += 1
        total += rng.expovariate(1.0)
    return count


def test_a_window_says_whether_the_engine_took_a_prompt_only_where_it_counts_prompts() -> None:
    """The response-cache check's sign of a copy that looks made: the prompt counter stood still.  Moved, the engine
    (or another user) took a prompt; with no prompt counter exposed, nothing is said either way."""
    prompts = "sglang:prompt_tokens_total"
    assert Window(1, {prompts: Change.between(400.0, 400.0), ABORTS: Change.between(3.0, 3.0)}).took_no_prompt()
    assert Window(1, {prompts: Change.between(400.0, 470.0)}).took_no_prompt() is False
    assert Window(1, {ABORTS: Change.between(3.0, 3.0)}).took_no_prompt() is None
    assert Window(1).took_no_prompt() is None
