"""The timing test's statistics and evidence, on measured-shaped samples (no engine needed): its false-alarm
rate holds when hits and misses are exchangeable, whatever the timings look like, and it finds a shift."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from prober.campaign.salts import claimed_salted, salt_asserted, salted_tenants, tenant_salts
from prober.checks.timing import check_decidable, findings_of, random_text
from prober.checks.timing_stats import PairDecision, PairSamples, decide, holm, smallest_p, stouffer
from prober.config.schema import TargetConfig, TenantConfig
from prober.config.sections import TimingSettings
from prober.domain.errors import PlanError
from prober.domain.evidence import SaltAsserted, TimingStatistics
from prober.domain.types import DetectorName, FindingKind, Severity

pytestmark = pytest.mark.unit


def samples(hits: list[float], misses: list[float], victim: str = "a", observer: str = "b") -> PairSamples:
    return PairSamples(victim, observer, tuple(hits), tuple(misses), warm=(), prompt_tokens=None, lost=0,
                       requests=3 * len(hits), tokens=0)


def null_pair(rng: random.Random, n: int) -> PairSamples:
    """What an isolated cache gives: one skewed, drifting TTFT series whose hit/miss labels are drawn at
    random, exactly as the check assigns them (heavy tail: one request in ten stalls)."""
    times = [(0.4 + 0.002 * i) * rng.lognormvariate(0, 0.3) * (rng.choice([1] * 9 + [6])) for i in range(2 * n)]
    hit = set(rng.sample(range(2 * n), n))
    return samples([t for i, t in enumerate(times) if i in hit], [t for i, t in enumerate(times) if i not in hit])


def test_false_alarm_rate_holds_on_exchangeable_samples() -> None:
    rng = random.Random(5)
    alpha, runs = 0.1, 500  # at the default 0.001 the rate would need ~10^5 runs to see
    alarms = sum(any(d.found for d in decide([[null_pair(rng, 12)], [null_pair(rng, 12)]], alpha)) for _ in range(runs))
    # Family-wise over both pairs: at most alpha; three standard errors of slack for the simulation.
    assert alarms / runs <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs), alarms


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


def test_rounds_keep_the_false_alarm_rate() -> None:
    """Another round only for unclear pairs, each look at alpha / looks: the rate over all looks holds."""
    rng = random.Random(11)
    alpha, runs = 0.1, 400
    alarms = sum(sequential(rng, lambda: null_pair(rng, 12), alpha, 3).found for _ in range(runs))
    assert alarms / runs <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / runs), alarms


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


def test_stouffer_combines_rounds() -> None:
    assert stouffer([0.03]) == 0.03
    assert stouffer([0.5, 0.5]) == pytest.approx(0.5)
    assert stouffer([0.05, 0.05]) == pytest.approx(0.01, abs=0.002)  # two weak rounds: stronger together
    assert stouffer([1.0, 1e-20]) == pytest.approx(0.0576, abs=1e-3)  # a round with no evidence dilutes
    assert 0 <= stouffer([1e-300, 1e-300]) < 1e-300 and stouffer([1.0, 1.0]) > 0.99


def test_holm_step_down() -> None:
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5]
    assert holm([0.6, 0.6]) == [1.0, 1.0]


def test_too_few_samples_for_the_false_alarm_rate_are_refused() -> None:
    with pytest.raises(PlanError, match=r"raise timing\.samples"):
        check_decidable(TimingSettings(samples=4, false_alarm=0.001), ["a", "b"])
    check_decidable(TimingSettings(samples=8, false_alarm=0.001), ["a", "b"])  # 1/12,870 < 0.0005


def test_random_prompts_are_fresh() -> None:
    rng = random.SystemRandom()
    texts = {random_text(40, rng) for _ in range(50)}
    assert len(texts) == 50 and all(len(t.split()) == 40 for t in texts)
    assert len({t[:12] for t in texts}) == 50  # unique from the first block on


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
