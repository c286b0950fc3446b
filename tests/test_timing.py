"""The timing test's statistics and evidence, on measured-shaped samples (no engine needed): its false-alarm
rate holds when hits and misses are exchangeable, whatever the timings look like, and it finds a shift.  Then the
check behind a gateway that loses answers (the reference engine behind tests/support/shared.py's gateway): lost
samples are drawn again within what the plan holds, and counted by why they were lost."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from prober.checks import REGISTRY, perform
from prober.checks.timing import TimingResult, check_decidable, findings_of, random_text
from prober.checks.timing.stats import Loss, PairDecision, PairSamples, decide, holm, smallest_p, stouffer
from prober.config.schema import TargetConfig, TenantConfig
from prober.config.sections import TimingSettings
from prober.domain.errors import PlanError
from prober.domain.evidence import SaltAsserted, TimingStatistics
from prober.domain.types import DetectorName, FindingKind, Severity
from prober.probing.plan import Planned
from prober.probing.salts import claimed_salted, salt_asserted, salted_tenants, tenant_salts
from tests.support.isolation import TESTBED_KEYS, surveyed
from tests.support.shared import Gateway
from tests.support.testbed import SMALL, StartTestbed


def samples(hits: list[float], misses: list[float], victim: str = "a", observer: str = "b") -> PairSamples:
    return PairSamples(victim, observer, tuple(hits), tuple(misses), warm=(), prompt_tokens=None, lost=(),
                       requests=3 * len(hits), tokens=0)


def null_pair(rng: random.Random, n: int) -> PairSamples:
    """What an isolated cache gives: one skewed, drifting TTFT series whose hit/miss labels are drawn at
    random, exactly as the check assigns them (heavy tail: one request in ten stalls)."""
    times = [(0.4 + 0.002 * i) * rng.lognormvariate(0, 0.3) * (rng.choice([1] * 9 + [6])) for i in range(2 * n)]
    hit = set(rng.sample(range(2 * n), n))
    return samples([t for i, t in enumerate(times) if i in hit], [t for i, t in enumerate(times) if i not in hit])


@pytest.mark.unit
def test_false_alarm_rate_holds_on_exchangeable_samples() -> None:
    rng = random.Random(5)
    alpha, runs = 0.1, 500  # at the default 0.001 the rate would need ~10^5 runs to see
    alarms = sum(any(d.found for d in decide([[null_pair(rng, 12)], [null_pair(rng, 12)]], alpha)) for _ in range(runs))
    # Family-wise over both pairs: at most alpha; three standard errors of slack for the simulation.
    assert alarms / runs <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs), alarms


@pytest.mark.unit
def test_a_cache_shaped_shift_is_found_with_its_evidence() -> None:
    rng = random.Random(9)
    # Measured on vLLM (engines.md): a cached 1,008-token prompt 0.12 s, a fresh one about 1.2 s.
    hits = [0.12 * rng.lognormvariate(0, 0.2) for _ in range(10)]
    misses = [1.2 * rng.lognormvariate(0, 0.2) for _ in range(10)]
    shared, isolated = decide([[samples(hits, misses)], [null_pair(rng, 10)]], 0.001)
    assert shared.found and not isolated.found
    assert shared.method == "exact" and shared.p_value == pytest.approx(smallest_p(10))
    assert shared.adjusted_p == pytest.approx(2 * smallest_p(10))  # Holm: the smallest of two p-values, times 2
    assert shared.hit_faster == 1.0
    [finding] = findings_of([shared, isolated], run_id="r1-")
    assert finding.kind is FindingKind.CROSS_TENANT_CACHE_TIMING and finding.severity is Severity.WARNING
    assert (finding.victim_tenant, finding.observer_tenant) == ("a", "b")
    stats = finding.evidence_of(TimingStatistics)
    assert stats is not None and finding.detector is DetectorName.TIMING
    assert stats.hits == stats.misses == 10 and stats.false_alarm == 0.001
    assert (stats.median_ttft_hit_s or 1.0) < 0.2 < 1.0 < (stats.median_ttft_miss_s or 0.0)
    assert "Mann-Whitney" in stats.test


@pytest.mark.unit
def test_slower_hits_are_no_evidence_of_sharing() -> None:
    """One-sided: load or queueing that slows the would-be hits is not a cache."""
    [decision] = decide([[samples([1.0 + i / 100 for i in range(12)], [0.5 + i / 100 for i in range(12)])]], 0.05)
    assert not decision.found and decision.p_value > 0.99


def shifted_pair(rng: random.Random, n: int, shift: float) -> PairSamples:
    """A cache that saves a little under load: hits `shift` faster than misses, in noise larger than the shift."""
    return samples([(0.5 - shift) * rng.lognormvariate(0, 0.5) for _ in range(n)],
                   [0.5 * rng.lognormvariate(0, 0.5) for _ in range(n)])


def sequential(rng: random.Random, pair: Callable[[], PairSamples], alpha: float, looks: int) -> PairDecision:
    """What check_timing does for one pair: another round while the decision is unclear, up to `looks`."""
    rounds = [pair()]
    while True:
        [decision] = decide([rounds], alpha, looks)
        if not decision.unclear or len(rounds) == looks:
            return decision
        rounds.append(pair())


@pytest.mark.unit
def test_rounds_keep_the_false_alarm_rate() -> None:
    """Another round only for unclear pairs, each look at alpha / looks: the rate over all looks holds."""
    rng = random.Random(11)
    alpha, runs = 0.1, 400
    alarms = sum(sequential(rng, lambda: null_pair(rng, 12), alpha, 3).found for _ in range(runs))
    assert alarms / runs <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs), alarms


@pytest.mark.unit
def test_a_small_shift_in_noise_is_found_with_more_rounds_where_one_could_not() -> None:
    """Load that blurs a cache's gain (hits 40% faster, log-normal noise of sigma 0.5): one round of 12 seldom
    decides at 0.001, up to three mostly do; an isolated cache mostly ends clear after its first round, seldom
    undecided (the figures docs/auditing.md quotes)."""
    rng = random.Random(3)
    one = sum(sequential(rng, lambda: shifted_pair(rng, 12, 0.2), 0.001, 1).found for _ in range(100))
    three = [sequential(rng, lambda: shifted_pair(rng, 12, 0.2), 0.001, 3) for _ in range(100)]
    assert one < 30 and sum(d.found for d in three) > 60, (one, sum(d.found for d in three))
    rng = random.Random(3)
    clean = [sequential(rng, lambda: null_pair(rng, 12), 0.001, 3) for _ in range(200)]
    assert sum(d.rounds == 1 for d in clean) > 140 and sum(d.unclear for d in clean) < 30
    assert not any(d.found for d in clean)
    late = next(d for d in three if d.found and d.rounds > 1)
    assert len(late.samples.hits) == 12 * late.rounds and late.evidence().rounds == late.rounds
    assert "Stouffer" in late.method


@pytest.mark.unit
def test_stouffer_combines_rounds() -> None:
    assert stouffer([0.03]) == 0.03
    assert stouffer([0.5, 0.5]) == pytest.approx(0.5)
    assert stouffer([0.05, 0.05]) == pytest.approx(0.01, abs=0.002)  # two weak rounds: stronger together
    assert stouffer([1.0, 1e-20]) == pytest.approx(0.0576, abs=1e-3)  # a round with no evidence dilutes
    assert 0 <= stouffer([1e-300, 1e-300]) < 1e-300 and stouffer([1.0, 1.0]) > 0.99


@pytest.mark.unit
def test_holm_step_down() -> None:
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5]
    assert holm([0.6, 0.6]) == [1.0, 1.0]


@pytest.mark.unit
def test_too_few_samples_for_the_false_alarm_rate_are_refused() -> None:
    with pytest.raises(PlanError, match=r"raise timing\.samples"):
        check_decidable(TimingSettings(samples=4, false_alarm=0.001), ["a", "b"])
    check_decidable(TimingSettings(samples=8, false_alarm=0.001), ["a", "b"])  # 1/12,870 < 0.0005


@pytest.mark.unit
def test_random_prompts_are_fresh() -> None:
    rng = random.SystemRandom()
    texts = {random_text(40, rng) for _ in range(50)}
    assert len(texts) == 50 and all(len(t.split()) == 40 for t in texts)
    assert len({t[:12] for t in texts}) == 50  # unique from the first block on


@pytest.mark.unit
def test_salted_tenants_and_the_broken_promise() -> None:
    claimed = claimed_salted([TenantConfig(name="a", cache_salted=True), TenantConfig(name="b")])
    plain = TargetConfig(name="t", url="http://127.0.0.1:1/v1")
    salting = TargetConfig(name="t", url="http://127.0.0.1:1/v1", cache_salt="per-tenant")
    assert salted_tenants(plain, ["a", "b"], claimed) == {"a"}
    assert salted_tenants(salting, ["a", "b"], claimed) == {"a", "b"}
    salts = tenant_salts(salting, ["a", "b"])
    assert len(set(salts.values())) == 2 and all(len(s) == 43 for s in salts.values())
    assert tenant_salts(plain, ["a", "b"]) == {}
    rng = random.Random(1)
    [decision] = decide([[samples([0.1 + rng.random() / 100 for _ in range(10)],
                                  [1.0 + rng.random() / 100 for _ in range(10)], victim="b", observer="a")]], 0.001)
    [finding] = findings_of([decision], run_id="", salted=frozenset({"a"}))
    assert finding.severity is Severity.HIGH and finding.evidence_of(SaltAsserted) == SaltAsserted(("a",))
    assert "salt does not isolate" in finding.excerpt
    assert salt_asserted(finding, frozenset({"c"})) is finding


def lossy(testbed: StartTestbed, tmp_path: Path, settings: TimingSettings, *, fail_after_served: float,
          retries: int) -> tuple[Planned, TimingResult, int]:
    """The timing check as the audit runs it, through the gateway from the survey on, which answers 502 to a share
    of the requests the engine served (from the check's first request on); what it planned, what it returned, and
    how many 502s the gateway gave meanwhile (the check's, and those of the route it measures first)."""
    engine = testbed("fixed", **{**SMALL, "prefill_ms_per_1k_tokens": 1_000}, faults={"shared_prefix_cache": True})

    async def go(front: Gateway) -> tuple[Planned, TimingResult, int]:
        async with surveyed(front.url, TESTBED_KEYS, tmp_path / "l.sqlite", retries=retries, timing=settings) as run:
            check = REGISTRY.get("timing")
            planned = check.planned(run)
            front.fail_after_served, before = fail_after_served, front.stats.failed_after_served
            result = await perform(check, run, planned)
            assert isinstance(result, TimingResult)
            return planned, result, front.stats.failed_after_served - before

    with Gateway(engine.url) as front:
        return asyncio.run(go(front))


@pytest.mark.slow
def test_samples_lost_to_a_gateways_502s_are_drawn_again_and_counted(testbed: StartTestbed, tmp_path: Path) -> None:
    """One served answer in five replaced by a 502 (the client retries: the retry's clock holds the failed attempt,
    and an observer's first attempt may have cached its own miss): every pair still gets all its samples, from fresh
    prompts drawn in the lost ones' places within the plan, the report says how many were lost and why, and the
    shared cache is still found.  Before re-draws: about four samples of twenty lost per pair, never replaced."""
    settings = TimingSettings(samples=10, prompt_tokens=200)
    planned, result, failed = lossy(testbed, tmp_path, settings, fail_after_served=0.2, retries=3)
    assert failed > 0 and not result.errors, (failed, result.errors)
    for decision in result.decisions:
        s = decision.samples
        assert len(s.hits) == len(s.misses) == settings.samples * decision.rounds, decision.evidence()
        assert s.redrawn == len(s.lost)  # each lost one drawn again, once it could be
    lost = result.losses
    assert 0 < lost[Loss.RETRIED] <= failed and set(lost) <= {Loss.RETRIED, Loss.FAILED, Loss.UNWARMED}, lost
    assert result.requests <= planned.requests == 2 * (3 * 10 * 3 + 5 * 3)
    doc = result.to_json()
    assert doc["lost"] == {loss.value: n for loss, n in lost.items()} and doc["redrawn"] == lost.total()
    # A pair the first round left undecided takes another: its samples are the rounds' (as each decision's above).
    assert [(p["hits"], p["misses"]) for p in doc["pairs"]] == [(10 * p["rounds"], 10 * p["rounds"])
                                                                 for p in doc["pairs"]], doc["pairs"]
    assert f"{lost.total()} samples lost" in result.summary() and len(result.notes) == 2, result.notes
    assert [d.found for d in result.decisions] == [True, True]


@pytest.mark.slow
def test_a_path_that_loses_every_answer_sends_no_more_than_the_plan(testbed: StartTestbed, tmp_path: Path) -> None:
    """Every answer a 502 and no retries: the check re-draws until what its plan holds for re-draws is spent, not
    one request more, and ends incomplete, saying why each sample was lost."""
    settings = TimingSettings(samples=10, prompt_tokens=200, rounds=1)
    planned, result, failed = lossy(testbed, tmp_path, settings, fail_after_served=1.0, retries=0)
    assert result.requests <= min(failed, planned.requests), (result.requests, planned, failed)  # + route's own
    assert planned.requests == 2 * (3 * 10 + 5)
    assert sum(d.samples.redrawn for d in result.decisions) == 2 * 5  # the re-draws the plan holds, all spent
    assert set(result.losses) == {Loss.UNWARMED, Loss.FAILED} and len(result.errors) == 2, result.losses
    assert all(d.samples.hits == d.samples.misses == () for d in result.decisions)
    assert "unwarmed" in result.errors[0] and "failed" in result.errors[0], result.errors
