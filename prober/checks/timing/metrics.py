"""The timing check's decisions as the daemon's series: per ordered tenant pair, the last run's adjusted p-value,
rounds, whether it ended undecided, and the median time to first token of would-be hits and of misses."""

from __future__ import annotations

from statistics import median

from prometheus_client import CollectorRegistry, Gauge

from prober.checks.base import ResultMetrics
from prober.checks.timing.result import TimingResult
from prober.probing.results import CheckResult

PAIR = ["target", "victim", "observer"]


class TimingMetrics(ResultMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        self.p = Gauge("leakprobe_cache_timing_p_value", "Last timing check's Holm-adjusted p-value that the "
                       "observer's would-be cache hits on the victim's prompts came back sooner than misses (a finding "
                       "at or below timing.false_alarm / timing.rounds).", PAIR, registry=registry)
        self.rounds = Gauge("leakprobe_cache_timing_rounds", "Rounds of samples the last timing check took for this "
                            "pair (at most timing.rounds; a pair still unclear then is undecided: "
                            "leakprobe_cache_timing_undecided).", PAIR, registry=registry)
        self.undecided = Gauge("leakprobe_cache_timing_undecided", "1 where the last timing check ended neither "
                               "finding this pair's prompts faster nor clearly no faster.", PAIR, registry=registry)
        self.ttft = Gauge("leakprobe_cache_timing_ttft_seconds", "Last timing check's median time to first token of "
                          "the observer's would-be hits and of its misses.", [*PAIR, "prompts"], registry=registry)
        self.series = [self.p, self.rounds, self.undecided, self.ttft]

    def observe(self, target: str, result: CheckResult) -> None:
        if not isinstance(result, TimingResult):
            return
        for decision in result.decisions:
            s = decision.samples
            self.p.labels(target, s.victim, s.observer).set(decision.adjusted_p)
            self.rounds.labels(target, s.victim, s.observer).set(decision.rounds)
            self.undecided.labels(target, s.victim, s.observer).set(int(decision.unclear))
            for prompts, ttfts in (("hit", s.hits), ("miss", s.misses)):
                if ttfts:
                    self.ttft.labels(target, s.victim, s.observer, prompts).set(median(ttfts))
