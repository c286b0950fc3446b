"""Prefix-cache isolation measured by time to first token alone (`cross_tenant_cache_timing`).

Hosted APIs do not return `cached_tokens`, but a prompt served from a prefix cache starts answering sooner:
Gu et al. (ICML 2025) found cross-user prompt caches at seven API providers by timing alone.  For each
ordered tenant pair the victim sends prompts of fresh random words; the observer then sends those same
prompts (would-be hits) and as many fresh ones (misses), in one random order, streaming, and a two-sample
test on the observer's TTFTs decides whether the would-be hits came back faster.

A sample that gives no TTFT (a 502 the client retried, a request that failed, an answer with no text: `Loss`) is
drawn again, a fresh prompt with the same label in a fresh random order, within the re-draws the plan holds; the
result counts what was lost, why, and what was drawn again.  Replicas behind one address keep a cache each: a
would-be hit reaches the replica its victim warmed only by chance (one in R, balanced over R), so a cache shared
on each replica shows as a smaller shift, never a false alarm (where a request lands is blind to its label, so a
faster replica serves hits and misses alike).  No engine names the replica in its answer, so samples are not
paired by replica.

The decision (the test, its rounds and pairs) is in prober/checks/timing/stats.py.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import string
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from prometheus_client import CollectorRegistry

from prober.checks.base import Check, Run
from prober.checks.timing.metrics import TimingMetrics
from prober.checks.timing.result import TimingResult, described
from prober.checks.timing.stats import Loss, PairDecision, PairSamples, decide, smallest_p
from prober.config.schema import ProberConfig
from prober.config.sections import TimingSettings
from prober.domain.errors import PlanError
from prober.domain.types import DetectorName, Finding, FindingKind, ProbeContext, Severity
from prober.probing.events import Observed
from prober.probing.plan import Planned, acceptance_limit, pairs
from prober.probing.results import CheckResult
from prober.probing.salts import salt_asserted
from prober.prompts.counter import TokenCounter
from prober.targets.base import Prompt
from prober.targets.result import Completion
from prober.targets.telemetry import EngineTelemetry, window

REDRAW_SHARE = 0.5  # re-draw requests a run may add, per pair and round, as a share of `samples`
WORD_LETTERS = 5  # random lowercase words: no dictionary, no tokenizer-specific merges to rely on
CALIBRATION_WORDS = 64

Send = Callable[[str, Prompt], Awaitable[Completion]]  # as this tenant (with its credential and cache salt)


def random_text(words: int, rng: random.Random) -> str:
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=WORD_LETTERS)) for _ in range(words))


def planned_requests(settings: TimingSettings, tenants: Sequence[str]) -> int:
    """Requests one run may send: per pair and round, the victim's warm-ups and the observer's hits and misses,
    for every round (what a budget must hold, though a clear pair stops after its first), and the re-draws."""
    return len(pairs(list(tenants))) * 3 * settings.samples * settings.rounds + redraw_requests(settings, tenants)


def redraw_requests(settings: TimingSettings, tenants: Sequence[str]) -> int:
    """Requests one run may add to draw fresh samples in lost ones' places: REDRAW_SHARE of the samples per pair
    and round, shared by all (a lost would-be hit costs two, the victim's warm-up and the observer's request)."""
    return len(pairs(list(tenants))) * settings.rounds * math.ceil(settings.samples * REDRAW_SHARE)


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


@dataclass
class Spare:
    """Requests left to re-draw lost samples: what the plan holds beyond the samples, for all pairs and rounds."""

    left: int


class Draw:
    """One round of one pair as it is sent: every request, what each measured, and what was lost and why."""

    def __init__(self, send: Send, pair: tuple[str, str], words: int, rng: random.Random, spare: Spare) -> None:
        self.send, (self.victim, self.observer), self.words, self.rng, self.spare = send, pair, words, rng, spare
        self.hits: list[float] = []
        self.misses: list[float] = []
        self.warm: list[float] = []
        self.lost: list[Loss] = []
        self.served: list[int] = []  # usage.prompt_tokens of the observer's answers
        self.requests = self.tokens = self.redrawn = 0

    def fresh(self) -> str:
        return random_text(self.words, self.rng)

    async def _send(self, tenant: str, text: str, *, redraw: bool) -> Completion:
        if redraw:
            self.spare.left -= 1
        self.requests += 1
        answer = await self.send(tenant, _prompt(text))
        self.tokens += _tokens(answer)
        return answer

    async def warmed(self, text: str, *, redraw: bool = False) -> bool:
        """The victim sends `text`; unanswered, it is in no cache and cannot be a would-be hit."""
        answer = await self._send(self.victim, text, redraw=redraw)
        if answer.served:
            self.warm.append(answer.ttft_s if answer.ttft_s is not None else answer.total_s)
        else:
            self.lost.append(Loss.UNWARMED)
        return answer.served

    async def warmed_or_redrawn(self, text: str) -> str | None:
        """`text` warmed, or a fresh prompt warmed in its place (its position in the order kept) while the spare
        allows; None where none could be."""
        redraw = False
        while not await self.warmed(text, redraw=redraw):
            if self.spare.left < 1:
                return None
            text, redraw = self.fresh(), True
            self.redrawn += 1
        return text

    async def observed(self, text: str, hit: bool, *, redraw: bool = False) -> bool:
        answer = await self._send(self.observer, text, redraw=redraw)
        if answer.usage and answer.usage.prompt_tokens:
            self.served.append(answer.usage.prompt_tokens)
        ttft = timed(answer)
        if isinstance(ttft, Loss):
            self.lost.append(ttft)
            return False
        (self.hits if hit else self.misses).append(ttft)
        return True

    def samples(self) -> PairSamples:
        return PairSamples(self.victim, self.observer, tuple(self.hits), tuple(self.misses), tuple(self.warm),
                           statistics.fmean(self.served) if self.served else None, tuple(self.lost), self.requests,
                           self.tokens, redrawn=self.redrawn)


async def measure_pair(send: Send, pair: tuple[str, str], *, words: int, samples: int, rng: random.Random,
                       spare: Spare, telemetry: EngineTelemetry | None = None) -> PairSamples:
    """The victim (`pair[0]`) warms `samples` fresh prompts; the observer sends them and as many fresh ones,
    shuffled; then fresh prompts in the places of those that gave no TTFT, while the spare allows.  One request at
    a time, so no request queues behind another."""
    draw = Draw(send, pair, words, rng, spare)
    async with window(telemetry, 3 * samples + spare.left) as engine:
        await _sample(draw, samples)
    return replace(draw.samples(), engine=engine.evidence())


async def _sample(draw: Draw, n: int) -> None:
    chosen = set(draw.rng.sample(range(2 * n), n))  # which fresh prompts become would-be hits: drawn at random
    prompts: list[tuple[str, bool]] = []  # (text, would-be hit)
    for i in range(2 * n):
        text = await draw.warmed_or_redrawn(draw.fresh()) if i in chosen else draw.fresh()
        if text is not None:  # None: a would-be hit that no warm-up reached; one fewer sent
            prompts.append((text, i in chosen))
    draw.rng.shuffle(prompts)
    pending = [hit for text, hit in prompts if not await draw.observed(text, hit)]
    # Each lost sample's label, in its own place in a fresh random order: with the labels drawn at random and
    # losses blind to them (a 502, a retry), the exact test's null still holds.  How many are re-drawn in a pass
    # is what the spare holds for hits (two requests each), so which are re-drawn does not depend on the labels.
    while pending and (k := min(len(pending), draw.spare.left // 2)):
        batch, pending = pending[:k], pending[k:]
        block: list[tuple[str, bool]] = []
        for hit in batch:
            text, draw.redrawn = draw.fresh(), draw.redrawn + 1
            if hit and not await draw.warmed(text, redraw=True):
                pending.append(hit)
            else:
                block.append((text, hit))
        draw.rng.shuffle(block)
        pending += [hit for text, hit in block if not await draw.observed(text, hit, redraw=True)]


def _prompt(text: str) -> Prompt:
    # One token is enough: TTFT is the moment the first text arrived, and decoding more only costs time.
    return Prompt(text, max_tokens=1, stream=True)


def timed(answer: Completion) -> float | Loss:
    """The observer's TTFT, or why it gives none.  A retried request's clock includes the failed attempt, and that
    attempt may have put the prompt in the observer's own cache: not a sample; nor is a copy a cache in front
    served (a shared response cache is its own finding, prober/probing/provenance.py)."""
    if not answer.served:
        return Loss.FAILED
    if answer.from_cache is not None:
        return Loss.CACHED
    if answer.retried:
        return Loss.RETRIED
    return Loss.NO_TEXT if answer.ttft_s is None else answer.ttft_s


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
    spare = Spare(redraw_requests(settings, tenants))
    for _ in range(settings.rounds):
        for index in unclear:
            measured[index].append(await measure_pair(send, every[index], words=words, samples=settings.samples,
                                                      rng=rng, spare=spare, telemetry=telemetry))
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
        if not s.lost:
            continue
        lost = f"{len(s.lost)} samples lost ({described(s.losses)}), {s.redrawn} drawn afresh in their places"
        if len(s.hits) < wanted // 2 or len(s.misses) < wanted // 2:
            result.errors.append(f"timing {s.victim}->{s.observer}: only {len(s.hits)} hits and {len(s.misses)} "
                                 f"misses of {wanted} each gave a TTFT: {lost}")
        else:
            result.notes.append(f"timing {s.victim}->{s.observer}: {len(s.hits)} hits and {len(s.misses)} misses "
                                f"of {wanted} each: {lost}")
    result.extra = findings_of(result.decisions, run_id=run_id, salted=salted)
    return result


class TimingCheck(Check):
    name = "timing"
    about = "prefix-cache isolation by time to first token alone: another tenant's prompts answered sooner"
    every = 21_600.0

    def in_audit(self, config: ProberConfig) -> bool:
        return config.timing.audit

    def metrics(self, registry: CollectorRegistry) -> TimingMetrics:
        return TimingMetrics(registry)

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
        for decision in result.decisions:  # a pair clearly no faster re-checks its incident; an undecided one does not
            if not (decision.found or decision.unclear):
                run.on_event(Observed(self.name, "", decision.samples.observer, (decision.samples.victim,)))
        return result
