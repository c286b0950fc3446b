"""The timing check's decision: the observer's TTFTs per ordered tenant pair, tested, rounds and pairs combined.

The test is a one-sided Mann-Whitney U (are hits stochastically faster?), exact where the samples have no
ties.  Why that test: which prompts are would-be hits is drawn at random and the observer sends all of them
in a random order, so when the cache is isolated the hit/miss labels are exchangeable and the exact U
distribution is the true null distribution, whatever the engine's timing looks like (skewed, heavy tailed,
drifting over the run).  One-sided, because a cache can only make a hit faster; a slower "hit" (load,
queueing) is no evidence of sharing.  U is a rank test, so one stalled request cannot decide it; it also
has more power against a shift than the Kolmogorov-Smirnov test Gu et al. used.  The p-values of a run's
pairs are adjusted with Holm's step-down method, so the chance that a run with a fully isolated cache
reports any pair is at most `false_alarm` (family-wise).

Evidence is collected until the decision is clear, not for a fixed count that load can break: a pair whose
first round of `samples` is neither found nor clearly no faster (one-sided p below `FUTILE_P`) gets another
round of fresh prompts, up to `rounds`; the rounds' exact p-values combine by Stouffer's method (each round is
its own randomised experiment, so a machine that grew busier between rounds shifts hits and misses alike).
Each look tests at `false_alarm / rounds` (Bonferroni over the looks, Holm over the pairs), so the family-wise
rate still holds; a pair still unclear after the last round is reported *undecided*, never clean.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from prober.domain.evidence import EngineCounters, TimingStatistics

TEST = ("one-sided Mann-Whitney U on streaming TTFT (would-be hits faster than misses), rounds combined by Stouffer, "
        "Bonferroni across rounds, Holm across pairs")

FUTILE_P = 0.2  # a pair at or above this is clearly not faster: no further round for it


class Loss(StrEnum):
    """Why a drawn sample gave no TTFT to test (the check draws another in its place while its budget allows)."""

    UNWARMED = "unwarmed"  # the victim's warm-up got no answer: the prompt is in no cache, so no would-be hit
    RETRIED = "retried"  # ours or a gateway's retry: the clock holds the failed attempt, which may have cached it
    FAILED = "failed"  # the observer's request got no answer after every retry (a 5xx, a timeout, a refusal)
    NO_TEXT = "no_text"  # served, but no text arrived to time
    CACHED = "cached"  # a cache in front of the engine served it: its clock is the cache's, not the engine's


@dataclass(frozen=True)
class PairSamples:
    """What one ordered pair measured: the observer's TTFTs (seconds) of hits and of misses."""

    victim: str
    observer: str
    hits: tuple[float, ...]
    misses: tuple[float, ...]
    warm: tuple[float, ...]  # the victim's own TTFTs of the prompts it warmed (cold, unless its cache is)
    prompt_tokens: float | None  # mean usage.prompt_tokens of the observer's answers
    lost: tuple[Loss, ...]  # one per sample that gave no usable TTFT, each drawn again while the budget allowed
    requests: int
    tokens: int  # prompt tokens sent (victim and observer)
    engine: EngineCounters | None = None
    redrawn: int = 0  # fresh prompts drawn in lost samples' places

    @property
    def losses(self) -> Counter[Loss]:
        return Counter(self.lost)

    @classmethod
    def merged(cls, rounds: Sequence[PairSamples]) -> PairSamples:
        """One pair's rounds as one body of evidence (the engine's counters: first before, last after, the
        deltas summed, since other pairs' rounds ran in between)."""
        first = rounds[0]
        if len(rounds) == 1:
            return first
        served = [r.prompt_tokens for r in rounds if r.prompt_tokens]
        engines = [r.engine for r in rounds if r.engine is not None]
        return cls(first.victim, first.observer, tuple(t for r in rounds for t in r.hits),
                   tuple(t for r in rounds for t in r.misses), tuple(t for r in rounds for t in r.warm),
                   statistics.fmean(served) if served else None, tuple(loss for r in rounds for loss in r.lost),
                   sum(r.requests for r in rounds), sum(r.tokens for r in rounds),
                   functools.reduce(EngineCounters.then, engines) if engines else None, sum(r.redrawn for r in rounds))


@dataclass(frozen=True)
class PairDecision:
    samples: PairSamples  # every round's, merged
    u: float  # Mann-Whitney U of the hits, summed over the rounds
    p_value: float  # one-sided, the rounds combined
    adjusted_p: float  # Holm over the run's pairs
    alpha: float  # the run's family-wise false-alarm rate
    method: str  # exact | asymptotic, and how many rounds were combined
    rounds: int = 1  # rounds measured
    looks: int = 1  # the most rounds the run may take: each look tests at alpha / looks

    @property
    def found(self) -> bool:
        return self.adjusted_p <= self.alpha / self.looks

    @property
    def unclear(self) -> bool:
        """Neither found nor clearly no faster: worth another round, or undecided after the last."""
        return not self.found and self.p_value < FUTILE_P

    @property
    def hit_faster(self) -> float:
        """Probability that a would-be hit starts sooner than a miss (0.5: no difference): the effect size."""
        n = len(self.samples.hits) * len(self.samples.misses)
        return 1 - self.u / n if n else 0.5

    def evidence(self) -> TimingStatistics:
        s = self.samples
        median_hit, median_miss = _median(s.hits), _median(s.misses)
        return TimingStatistics(
            test=TEST, method=self.method, p_value=self.p_value, adjusted_p=self.adjusted_p, false_alarm=self.alpha,
            rounds=self.rounds, most_rounds=self.looks, u=self.u, hit_faster_probability=round(self.hit_faster, 4),
            median_ttft_hit_s=median_hit, median_ttft_miss_s=median_miss,
            median_ratio=round(median_hit / median_miss, 4) if median_hit and median_miss else None,
            median_ttft_victim_warm_s=_median(s.warm), hits=len(s.hits), misses=len(s.misses), lost=len(s.lost),
            requests=s.requests, tokens=s.tokens,
            mean_prompt_tokens=round(s.prompt_tokens, 1) if s.prompt_tokens else None)


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 6) if values else None


def smallest_p(samples: int) -> float:
    """The smallest one-sided exact p-value with `samples` hits and as many misses: 1 / C(2n, n)."""
    return 1 / math.comb(2 * samples, samples)


def decide(measured: Sequence[Sequence[PairSamples]], alpha: float, looks: int = 1) -> list[PairDecision]:
    """One-sided U per pair and round, the rounds combined (Stouffer), then Holm's step-down adjustment over the
    pairs; each pair is tested at `alpha / looks`, the run's share of its false-alarm rate for one look."""
    from scipy.stats import mannwhitneyu  # here, not at the top: importing scipy.stats costs each command ~1.5 s

    raw: list[tuple[float, float, str]] = []
    for rounds in measured:
        tests = []
        for s in rounds:
            if not s.hits or not s.misses:
                tests.append((len(s.hits) * len(s.misses) / 2, 1.0, "none"))
                continue
            method = "exact" if len(set(s.hits + s.misses)) == len(s.hits) + len(s.misses) else "asymptotic"
            result = mannwhitneyu(s.hits, s.misses, alternative="less", method=method)
            tests.append((float(result.statistic), float(result.pvalue), method))
        methods = "+".join(sorted({m for _, _, m in tests}))
        raw.append((sum(u for u, _, _ in tests), stouffer([p for _, p, _ in tests]),
                    methods if len(tests) == 1 else f"{methods}, {len(tests)} rounds (Stouffer)"))
    adjusted = holm([p for _, p, _ in raw])
    return [PairDecision(PairSamples.merged(rounds), u, p, adj, alpha, method, len(rounds), looks)
            for rounds, (u, p, method), adj in zip(measured, raw, adjusted, strict=True)]


def stouffer(p_values: Sequence[float]) -> float:
    """One-sided p-values of independent experiments combined: Phi(sum of Phi^-1(p) / sqrt(k)); one is itself."""
    if len(p_values) == 1:
        return p_values[0]
    normal = statistics.NormalDist()
    z = sum(normal.inv_cdf(min(max(p, 1e-300), 1 - 1e-12)) for p in p_values) / math.sqrt(len(p_values))
    return normal.cdf(z)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values: reject those <= alpha and the family-wise error rate is at most alpha."""
    k = len(p_values)
    order = sorted(range(k), key=lambda i: p_values[i])
    adjusted = [1.0] * k
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (k - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
