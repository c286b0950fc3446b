"""Prefix-cache isolation measured by time to first token alone (`cross_tenant_cache_timing`).

Hosted APIs do not return `cached_tokens`, but a prompt served from a prefix cache starts answering sooner:
Gu et al. (ICML 2025) found cross-user prompt caches at seven API providers by timing alone.  For each
ordered tenant pair the victim sends prompts of fresh random words; the observer then sends those same
prompts (would-be hits) and as many fresh ones (misses), in one random order, streaming, and a two-sample
test on the observer's TTFTs decides whether the would-be hits came back faster.

The decision (the test, its rounds and pairs) is in prober/checks/timing_stats.py.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import string
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from prober.campaign.events import CheckDone
from prober.campaign.plan import Planned, acceptance_limit, pairs
from prober.campaign.results import CheckResult
from prober.campaign.salts import salt_asserted
from prober.checks.base import Check, Run
from prober.checks.timing_stats import PairDecision, PairSamples, decide, smallest_p
from prober.config.schema import ProberConfig
from prober.config.sections import TimingSettings
from prober.domain.errors import PlanError
from prober.domain.types import DetectorName, Finding, FindingKind, ProbeContext, Severity
from prober.prompts.counter import TokenCounter
from prober.targets.base import Prompt
from prober.targets.result import Completion
from prober.targets.telemetry import EngineTelemetry, window

WORD_LETTERS = 5  # random lowercase words: no dictionary, no tokenizer-specific merges to rely on
CALIBRATION_WORDS = 64

Send = Callable[[str, Prompt], Awaitable[Completion]]  # as this tenant (with its credential and cache salt)


@dataclass(kw_only=True)
class TimingResult(CheckResult):
    decisions: list[PairDecision] = field(default_factory=list)
    content: bool = False  # it reads times, not answers

    @property
    def undecided(self) -> list[PairDecision]:
        """Pairs still neither found nor clearly no faster after their last round: no finding, and no proof of
        isolation either (a busy target; the next run measures afresh)."""
        return [d for d in self.decisions if d.unclear]

    @property
    def requests(self) -> int:
        return sum(d.samples.requests for d in self.decisions)

    def summary(self) -> str:
        found = sum(d.found for d in self.decisions)
        return (f"timing: {len(self.decisions)} tenant pairs, {found} answering sooner for another's prompts, "
                f"{len(self.undecided)} undecided, {self.requests:,} requests")

    def still_checked(self) -> str | None:
        if not self.decisions:
            return None
        undecided = len(self.undecided)
        return f"timing ({len(self.decisions)} tenant pairs" + (
            f", {undecided} undecided after {self.decisions[0].looks} rounds)" if undecided else ")")


def random_text(words: int, rng: random.Random) -> str:
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=WORD_LETTERS)) for _ in range(words))


def planned_requests(settings: TimingSettings, tenants: Sequence[str]) -> int:
    """Requests one run may send: per pair and round, the victim's warm-ups and the observer's hits and misses,
    for every round (what a budget must hold, though a clear pair stops after its first)."""
    return len(pairs(list(tenants))) * 3 * settings.samples * settings.rounds


def planned_tokens(settings: TimingSettings, tenants: Sequence[str]) -> int:
    """Prompt tokens one run may send."""
    return planned_requests(settings, tenants) * settings.prompt_tokens


def check_decidable(settings: TimingSettings, tenants: Sequence[str]) -> None:
    """Refuse a run that could never reach the false-alarm rate, whatever it measured."""
    k = len(pairs(list(tenants)))
    if smallest_p(settings.samples) > settings.false_alarm / k / settings.rounds:
        raise PlanError(f"timing: {settings.samples} samples per pair can never reach a false-alarm rate of "
                        f"{settings.false_alarm} over {k} pairs and {settings.rounds} rounds; raise timing.samples")


async def words_for(counter: TokenCounter, tokens: int, rng: random.Random) -> int:
    """How many random words make a prompt of about `tokens` tokens for this tokenizer: the cost of a word from the
    difference of two lengths, so that a template's (or a gateway's) fixed tokens do not count as words."""
    short = await counter.count(random_text(CALIBRATION_WORDS // 2, rng))
    long = await counter.count(random_text(CALIBRATION_WORDS, rng))
    per_word = max(1.0, (long - short) / (CALIBRATION_WORDS - CALIBRATION_WORDS // 2))
    return max(1, round((tokens - max(0, short - per_word * CALIBRATION_WORDS // 2)) / per_word))


async def measure_pair(send: Send, victim: str, observer: str, *, words: int, settings: TimingSettings,
                       rng: random.Random, telemetry: EngineTelemetry | None = None) -> PairSamples:
    """The victim warms `samples` fresh prompts; the observer sends them and as many fresh ones, shuffled.
    One request at a time, so no request queues behind another."""
    n = settings.samples
    texts = [random_text(words, rng) for _ in range(2 * n)]
    hit_texts = set(rng.sample(range(2 * n), n))  # which fresh prompts become would-be hits: drawn at random
    async with window(telemetry, 3 * n) as engine:
        samples = await _sample(send, victim, observer, texts, hit_texts, rng)
    return replace(samples, engine=engine.evidence())


async def _sample(send: Send, victim: str, observer: str, texts: list[str], hit_texts: set[int],
                  rng: random.Random) -> PairSamples:
    n = len(hit_texts)
    warm: list[float] = []
    lost, tokens = 0, 0
    unwarmed: set[int] = set()
    for i in sorted(hit_texts):
        answer = await send(victim, _prompt(texts[i]))
        tokens += _tokens(answer)
        if answer.served:
            warm.append(answer.ttft_s if answer.ttft_s is not None else answer.total_s)
        else:  # never in the victim's cache: no would-be hit, so not sent as one
            unwarmed.add(i)
            lost += 1
    order = [i for i in range(2 * n) if i not in unwarmed]
    rng.shuffle(order)
    hits: list[float] = []
    misses: list[float] = []
    served: list[int] = []
    for i in order:
        answer = await send(observer, _prompt(texts[i]))
        tokens += _tokens(answer)
        if answer.usage and answer.usage.prompt_tokens:
            served.append(answer.usage.prompt_tokens)
        ttft = _ttft(answer)
        if ttft is None:
            lost += 1
        else:
            (hits if i in hit_texts else misses).append(ttft)
    return PairSamples(victim, observer, tuple(hits), tuple(misses), tuple(warm),
                       statistics.fmean(served) if served else None, lost, n + len(order), tokens)


def _prompt(text: str) -> Prompt:
    # One token is enough: TTFT is the moment the first text arrived, and decoding more only costs time.
    return Prompt(text, max_tokens=1, stream=True)


def _ttft(answer: Completion) -> float | None:
    """A retried request's clock includes the failed attempt: not a sample."""
    return answer.ttft_s if answer.served and not answer.retried else None


def _tokens(answer: Completion) -> int:
    return (answer.usage.prompt_tokens or 0) if answer.usage else 0


def findings_of(decisions: Sequence[PairDecision], *, run_id: str, salted: frozenset[str] = frozenset()
                ) -> list[Finding]:
    """A finding per pair whose would-be hits were faster at the run's false-alarm rate."""
    found = []
    for index, decision in enumerate(decisions):
        if not decision.found:
            continue
        s = decision.samples
        stats = decision.evidence()
        message = (f"{s.observer}'s requests for prompts {s.victim} had just sent started answering sooner "
                   f"(median TTFT {stats.median_ttft_hit_s} s vs {stats.median_ttft_miss_s} s for fresh "
                   f"prompts; p = {decision.adjusted_p:.2g} after Holm over {len(decisions)} pairs, false-alarm rate "
                   f"{decision.alpha}): the prefix cache is shared between these tenants")
        record = f"{run_id}timing{index + 1:02d}"
        found.append(salt_asserted(Finding(
            record_id=record, kind=FindingKind.CROSS_TENANT_CACHE_TIMING, detector=DetectorName.TIMING,
            severity=Severity.WARNING, score=decision.hit_faster, observer_tenant=s.observer,
            victim_tenant=s.victim, probe_id=record, excerpt=message,
            context=ProbeContext(prompt_tokens=round(s.prompt_tokens) if s.prompt_tokens else None),
            evidence=(stats, s.engine) if s.engine else (stats,)), salted))
    return found


async def check_timing(send: Send, counter: TokenCounter, tenants: Sequence[str], settings: TimingSettings, *,
                       run_id: str = "", salted: frozenset[str] = frozenset(), telemetry: EngineTelemetry | None = None,
                       longest: int | None = None, rng: random.Random | None = None) -> TimingResult:
    """Every ordered pair (both ways for two tenants, a ring for more), decided together.  Prompts are at most
    half of `longest` (the longest prompt the target serves), leaving the word count's estimate room."""
    check_decidable(settings, tenants)
    rng = rng or random.SystemRandom()  # fresh prompts nobody can predict, and an order nobody can either
    tokens = settings.prompt_tokens if longest is None else max(1, min(settings.prompt_tokens, longest // 2))
    words = await words_for(counter, tokens, rng)
    every = pairs(list(tenants))
    measured: list[list[PairSamples]] = [[] for _ in every]
    unclear = list(range(len(every)))
    decisions: list[PairDecision] = []
    for _ in range(settings.rounds):
        for index in unclear:
            victim, observer = every[index]
            measured[index].append(await measure_pair(send, victim, observer, words=words, settings=settings,
                                                      rng=rng, telemetry=telemetry))
        # In a worker thread: the first decision imports scipy.stats (seconds of CPU on a busy machine), which on
        # the event loop held up everything else the process serves, a daemon's /metrics among it.
        decisions = await asyncio.to_thread(decide, measured, settings.false_alarm, settings.rounds)
        unclear = [i for i, decision in enumerate(decisions) if decision.unclear]
        if not unclear:
            break
    result = TimingResult(check=TimingCheck.name, decisions=decisions,
                          other_tokens=sum(d.samples.tokens for d in decisions))
    for decision in result.decisions:
        s, wanted = decision.samples, settings.samples * decision.rounds
        if len(s.hits) < wanted // 2 or len(s.misses) < wanted // 2:
            result.errors.append(f"timing {s.victim}->{s.observer}: only {len(s.hits)} hits and {len(s.misses)} "
                                 f"misses of {wanted} each gave a TTFT ({s.lost} lost)")
    result.extra = findings_of(result.decisions, run_id=run_id, salted=salted)
    return result


class TimingCheck(Check):
    name = "timing"
    about = "prefix-cache isolation by time to first token alone: another tenant's prompts answered sooner"
    every = 21_600.0

    def in_audit(self, config: ProberConfig) -> bool:
        return config.timing.audit

    def planned(self, run: Run) -> Planned:
        tenants = run.target.tenants
        requests = planned_requests(run.config.timing, tenants)
        return Planned.of(planned_tokens(run.config.timing, tenants), requests, requests)  # one answer token each

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        ctx = run.target
        refused_from = acceptance_limit(ctx.capacity)
        counter = (await ctx.route()).counter
        result = await check_timing(ctx.send_as, counter, ctx.tenants, run.config.timing, run_id=run.run_id,
                                    salted=ctx.salted, telemetry=ctx.telemetry,
                                    longest=refused_from - 1 if refused_from else None)
        result.extra = await ctx.judge.persist(result.extra, None, run.on_event, check=self.name)
        run.on_event(CheckDone(ctx.config.name, result))
        return result
