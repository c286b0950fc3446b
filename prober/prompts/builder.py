"""Prompts of an exact token length, optionally with a complete canary in every KV page.

Layout: `instruction\\n` (the probe's request, on the first line) + body + tail padding (+ a cue line).  The
body is a unit repeated: a filler block, or, with canaries, a filler stretch plus one canary sentence.  A cue
is an unfinished canary sentence at the very end: a base model that reads no instruction continues it from
what it attends over, which is how a real model shows a code sitting in its KV cache.  Segment
costs are measured through the target's counter as differences against the header, so the chat template
and BOS cancel out; lengths are then assembled arithmetically, and with a tokenizer endpoint the whole
prompt is counted once more and the tail padding corrected until the count is exact.

Segments end with a line break and start with a capital letter, and the pad is one word costing one token,
which keeps costs additive across tokenizers that split on whitespace (BPE, SentencePiece, the testbed's).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from prober.canaries.tokens import lookalike
from prober.domain.errors import BuildError
from prober.domain.types import Canary
from prober.prompts.costs import SegmentCosts
from prober.prompts.counter import TokenCounter

FILLER_BLOCK_TOKENS = 256
CANARY_SENTENCE = "The reference code for this section is {code}."
CUE = CANARY_SENTENCE.split("{code}", 1)[0].rstrip()  # the same sentence, left for the model to finish
CANARY_SAMPLES = 4
VERIFY_ROUNDS = 6

MintCanaries = Callable[[int], Awaitable[Sequence[Canary]]]  # persisted before it returns


@dataclass(frozen=True)
class BuiltPrompt:
    text: str
    requested: int
    tokens: int  # the engine's count of the whole text when `counted`, else the calibrated prediction
    counted: bool
    counter: str
    canaries: tuple[Canary, ...] = ()
    canary_period: int | None = None  # every aligned window of this many tokens holds a complete canary
    # Tokens at the start that another prompt may share (template, instruction, the first filler); everything
    # after them is new, so no honest prefix cache can hold more of this prompt.  None: not known to be new.
    fresh_from: int | None = None
    # Characters from the start that hold something no other prompt holds (its nonce, its first canary): a prompt
    # that shares this much of it shares what only this one was sent with.  None: nothing unique is known.
    unique_at: int | None = None
    path: int = 0  # tokens the path was taken to put in front (`through`): the rest of `tokens` is this text's

    @property
    def exact(self) -> bool:
        return self.counted and self.tokens == self.requested

    def through(self, overhead: int) -> BuiltPrompt:
        """As the engine sees it behind a path that puts `overhead` tokens in front (a gateway's system prompt)."""
        if not overhead:
            return self
        return replace(self, requested=self.requested + overhead, tokens=self.tokens + overhead, path=overhead,
                       fresh_from=None if self.fresh_from is None else self.fresh_from + overhead)


@dataclass(frozen=True)
class Facts:
    """Fact canaries for one prompt: sample texts of their language (never planted: they size the units),
    the mint that makes the real ones, and the share of canary units that carry one."""

    samples: Sequence[str]
    mint: MintCanaries
    share: float


@dataclass
class _Body:
    """Canary units of one prompt, and the filler each opens with."""

    parts: list[str]
    unit_cost: float
    canaries: tuple[Canary, ...]
    period: int
    filler: str
    filler_cost: int
    fact_room: int  # tokens a fact may take in a unit (0: no facts)


class PromptBuilder:
    """One per target (its tokenizer); what segments cost is measured once (`SegmentCosts`)."""

    def __init__(self, counter: TokenCounter, *, language: str = "en") -> None:
        self.counter = counter
        self.costs = SegmentCosts(counter, language)
        self._lookalikes = [lookalike() for _ in range(CANARY_SAMPLES)]

    async def build(self, tokens: int, *, instruction: str, mint: MintCanaries | None = None,
                    facts: Facts | None = None, page_size: int | None = None, seed: int = 0,
                    cue: bool = False, lead: bool = False, nonce: str | None = None) -> BuiltPrompt:
        """`mint` makes token canaries (one in every canary unit); `facts`, fact canaries that open every
        1/share-th unit in place of the same number of filler tokens.  `cue`: end with `CUE`, for the model to
        finish.  `lead`: canaries in the first unit only, filler after it, so that a model finishing the cue
        finds a code only at the start (where a request's stale first page sits).  `nonce`: lead with it
        (unique to this prompt), so that nothing after the first line can have been sent before."""
        header, pad, overhead, ending, tail = await self._frame(instruction, cue, nonce)
        if tokens < overhead + tail:
            raise BuildError(f"{tokens} tokens is below the {overhead + tail} that the instruction alone costs")
        budget = tokens - overhead - tail
        minted: tuple[Canary, ...] = ()
        unit_of: list[int] = []  # for each canary, the unit that carries it (units may be dropped below)
        period: int | None = None
        fresh: int | None = overhead if nonce else None
        parts: list[str] = []
        costs: list[float] = []  # of each part
        if mint is not None:
            body = await self._canary_body(header, budget, overhead, mint, page_size or 16, seed, facts,
                                           units=1 if lead else None)
            parts, costs, minted, period = body.parts, [body.unit_cost] * len(body.parts), body.canaries, body.period
            unit_of = list(range(len(minted)))
            fresh = min(fresh or tokens, overhead + math.ceil(body.unit_cost) + 4)  # the first canary is new
            if facts is not None and facts.share > 0:
                planted = await self._with_facts(header, body, facts, seed)
                minted += tuple(fact for _, fact in planted)
                unit_of += [index for index, _ in planted]
        if mint is None or lead:
            room = budget - round(sum(costs))
            block = await self.costs.filler_of(header, min(FILLER_BLOCK_TOKENS, room), seed) if room > 0 else ""
            block_cost = float(await self.costs.cost(header, block)) if block else 0.0
            blocks = int(room // block_cost) if block_cost else 0
            parts, costs = parts + [block] * blocks, costs + [block_cost] * blocks
        pads = budget - round(sum(costs))
        if not self.counter.free:
            text = header + "".join(parts) + pad * max(0, pads) + ending
            kept = _kept(minted, unit_of, len(parts))
            return BuiltPrompt(text, tokens, tokens, False, self.counter.source, kept, period, fresh,
                               _unique_at(text, nonce, kept))
        actual = 0
        for _ in range(VERIFY_ROUNDS):
            while pads < 0 and parts:  # over: drop whole units from the end, never cut into a canary
                parts.pop()
                pads += round(costs.pop())
            text = header + "".join(parts) + pad * max(0, pads) + ending
            actual = await self.counter.count(text)
            if actual == tokens:
                break
            pads += tokens - actual
        kept = _kept(minted, unit_of, len(parts))
        return BuiltPrompt(text, tokens, actual, True, self.counter.source, kept, period, fresh,
                           _unique_at(text, nonce, kept))

    async def _frame(self, instruction: str, cue: bool, nonce: str | None) -> tuple[str, str, int, str, int]:
        """What every prompt of this instruction has: header, pad word, the header's cost, ending and its cost."""
        header = (f"{nonce} " if nonce else "") + instruction.strip() + "\n"
        pad = await self.costs.pad(header)
        overhead = await self.costs.count(header + pad) - 1  # with a word after it, for the same reason as the pad's
        ending = "\n" + CUE if cue else ""
        tail = await self.costs.cost(header + pad, ending) if ending else 0
        return header, pad, overhead, ending, tail

    async def shortest(self, instruction: str, *, cue: bool = False, nonce: str | None = None) -> int:
        """The fewest tokens a prompt of one token canary can have, as this counter counts (with a usage-calibrated
        counter that includes what the path to the engine adds in front)."""
        header, _, overhead, _, tail = await self._frame(instruction, cue, nonce)
        canary = max([await self.costs.cost(header, CANARY_SENTENCE.format(code=code) + "\n")
                      for code in self._lookalikes])
        return overhead + tail + canary + 1

    async def _canary_body(self, header: str, budget: int, overhead: int, mint: MintCanaries, page: int,
                           seed: int, facts: Facts | None, *, units: int | None = None) -> _Body:
        """Units of filler + one canary sentence, short enough that every aligned page (or every run of
        k pages, when one canary is longer than half a page) holds a complete canary, and with filler long
        enough to give way to a fact where facts are planted; as many as fit, or at most `units`."""
        # Costs measured on look-alikes, so that only canaries that go into the prompt are minted (a short
        # sentinel prompt holds one) and a repeated build reuses the measurements.
        costs = [await self.costs.cost(header, CANARY_SENTENCE.format(code=code) + "\n") for code in self._lookalikes]
        canary_cost = max(costs) + 1  # headroom for canaries that tokenize a little longer than the sample
        fact_room = 0
        if facts is not None and facts.share > 0:
            fact_costs = [await self.costs.cost(header, text.strip() + "\n") for text in facts.samples]
            fact_room = max(fact_costs) + max(fact_costs) // 4  # facts vary more than tokens do
        pages = max(1, -(-(2 * canary_cost + fact_room - 1) // page))
        period = pages * page
        unit = period - canary_cost + 1  # canary starts at most this far apart
        filler = await self.costs.filler_of(header, unit - canary_cost, seed)
        filler_cost = await self.costs.cost(header, filler) if filler else 0
        mean_unit = filler_cost + sum(costs) / len(costs)
        count = int(budget // mean_unit) if units is None else min(units, int(budget // mean_unit))
        if count == 0:  # shorter than one unit (a sentinel): one canary after a shorter lead-in
            if budget < canary_cost:
                raise BuildError(f"{budget + overhead} tokens leave no room for a canary (one costs ~{canary_cost})")
            filler = await self.costs.filler_of(header, budget - canary_cost, seed)
            filler_cost = await self.costs.cost(header, filler) if filler else 0
            mean_unit, count = filler_cost + sum(costs) / len(costs), 1
        minted = tuple(await mint(count))
        parts = [filler + CANARY_SENTENCE.format(code=c.text) + "\n" for c in minted]
        return _Body(parts, mean_unit, minted, period, filler, filler_cost, fact_room)

    async def _with_facts(self, header: str, body: _Body, facts: Facts, seed: int) -> list[tuple[int, Canary]]:
        """Every k-th unit's filler (k = round(1 / share)) becomes a fact sentence plus filler of the filler's
        cost minus the fact's, so the unit costs what it cost and every page keeps its token canary."""
        chosen = list(range(0, len(body.parts), max(1, round(1 / facts.share))))
        minted = list(await facts.mint(len(chosen))) if chosen else []
        # A fact takes the room of the longest sample (plus headroom), so one shorter filler serves them all;
        # only a fact longer than every sample is counted, and left out if it does not fit.
        room = body.fact_room
        longest = max(len(text) for text in facts.samples)
        shorter = await self.costs.filler_of(header, body.filler_cost - room, seed) if body.filler_cost > room else ""
        planted = []
        for index, fact in zip(chosen, minted, strict=False):
            sentence = fact.text.strip() + "\n"
            if len(sentence) > longest and await self.costs.cost(header, sentence) > room:
                continue
            body.parts[index] = sentence + shorter + body.parts[index][len(body.filler):]
            planted.append((index, fact))
        return planted


def _unique_at(text: str, nonce: str | None, canaries: tuple[Canary, ...]) -> int | None:
    """Where the first thing only this prompt holds ends: its leading nonce, else its first canary."""
    if nonce:
        return len(nonce)
    ends = [at + len(c.text) for c in canaries if (at := text.find(c.text)) >= 0]
    return min(ends, default=None)


def _kept(canaries: tuple[Canary, ...], unit_of: list[int], units: int) -> tuple[Canary, ...]:
    return tuple(c for c, unit in zip(canaries, unit_of, strict=True) if unit < units)
