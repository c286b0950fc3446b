"""The engine's failure counters against other users' traffic, as statistics and policy: windows and a background
in this process.  (Against the reference engine behind a gateway with other tenants' aborts, and on an engine that
answers its aborts with HTTP 200: tests/test_shared_endpoint.py and tests/test_engine_bugs.py.)"""

from __future__ import annotations

import random

import pytest

from prober.campaign.counters import CounterEvidence, rate_test
from prober.domain.evidence import Change, CounterTest
from prober.domain.types import FindingKind, ProbeContext, Severity
from prober.targets.telemetry import Background, Reading, Window, incomparable

pytestmark = pytest.mark.unit

ABORTS = "sglang:num_aborted_requests_total"


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


def poisson(rng: random.Random, mean: float) -> int:
    count, total = 0, rng.expovariate(1.0)
    while total < mean:
        count += 1
        total += rng.expovariate(1.0)
    return count
