"""Prompts of an exact token length, optionally with a complete canary in every KV page.

Layout: `instruction\\n` (the probe's request, on the first line) + body + tail padding.  The body is a
unit repeated: a filler block, or, with canaries, a filler stretch plus one canary sentence.  Segment
costs are measured through the target's counter as differences against the header, so the chat template
and BOS cancel out; lengths are then assembled arithmetically, and with a tokenizer endpoint the whole
prompt is counted once more and the tail padding corrected until the count is exact.

Segments end with a line break and start with a capital letter, and the pad is one word costing one token,
which keeps costs additive across tokenizers that split on whitespace (BPE, SentencePiece, the testbed's).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from prober.canaries import tokens
from prober.canaries.filler import load_filler
from prober.prompts.counter import TokenCounter
from prober.types import Canary

PAD_CANDIDATES = (" the", " and", " a", " of", " to")
FILLER_BLOCK_TOKENS = 256
CANARY_SENTENCE = "The reference code for this section is {code}."
CANARY_SAMPLES = 4
VERIFY_ROUNDS = 6

MintCanaries = Callable[[int], Awaitable[Sequence[Canary]]]  # persisted before it returns


class BuildError(ValueError):
    pass


@dataclass(frozen=True)
class BuiltPrompt:
    text: str
    requested: int
    tokens: int  # the engine's count of the whole text when `counted`, else the calibrated prediction
    counted: bool
    counter: str
    canaries: tuple[Canary, ...] = ()
    canary_period: int | None = None  # every aligned window of this many tokens holds a complete canary

    @property
    def exact(self) -> bool:
        return self.counted and self.tokens == self.requested


class PromptBuilder:
    """One per target (its tokenizer); caches every segment cost it measures."""

    def __init__(self, counter: TokenCounter, *, language: str = "en") -> None:
        self.counter = counter
        self.filler = load_filler(language)
        self._counts: dict[str, int] = {}
        self._pad: str | None = None
        self._lookalikes = [tokens.lookalike() for _ in range(CANARY_SAMPLES)]

    async def _count(self, text: str) -> int:
        if text not in self._counts:
            self._counts[text] = await self.counter.count(text)
        return self._counts[text]

    async def _cost(self, header: str, segment: str) -> int:
        return await self._count(header + segment) - await self._count(header)

    async def pad(self, header: str) -> str:
        """A word that costs exactly one token, also when repeated."""
        if self._pad is None:
            for word in PAD_CANDIDATES:
                if await self._cost(header, word) == 1 and await self._cost(header, word * 16) == 16:
                    self._pad = word
                    break
            else:
                raise BuildError(f"no single-token pad word among {PAD_CANDIDATES!r} for this tokenizer")
        return self._pad

    async def _filler_of(self, header: str, tokens: int, seed: int) -> str:
        """Filler sentences costing exactly `tokens` (whole words, then pad words to fill)."""
        pad = await self.pad(header)
        if tokens <= 0:
            return ""
        words = self.filler.text(tokens * 8, seed).split(" ")
        lo, hi = 0, min(len(words), tokens)  # a word costs at least one token
        while lo < hi:  # the most words that fit
            mid = (lo + hi + 1) // 2
            if await self._cost(header, _line(words[:mid])) <= tokens:
                lo = mid
            else:
                hi = mid - 1
        text = _line(words[:lo])
        missing = tokens - await self._cost(header, text)
        return text.removesuffix("\n") + pad * missing + "\n"

    async def build(self, tokens: int, *, instruction: str, mint: MintCanaries | None = None,
                    page_size: int | None = None, seed: int = 0) -> BuiltPrompt:
        header = instruction.strip() + "\n"
        overhead = await self._count(header)
        if tokens < overhead:
            raise BuildError(f"{tokens} tokens is below the {overhead} that the instruction alone costs")
        pad = await self.pad(header)
        budget = tokens - overhead
        minted: tuple[Canary, ...] = ()
        period: int | None = None
        if mint is None:
            block = await self._filler_of(header, min(FILLER_BLOCK_TOKENS, budget), seed)
            unit_cost = float(await self._cost(header, block)) if block else 0.0
            parts = [block] * (int(budget // unit_cost) if unit_cost else 0)
        else:
            parts, unit_cost, minted, period = await self._canary_body(header, budget, overhead, mint,
                                                                       page_size or 16, seed)
        pads = tokens - overhead - round(len(parts) * unit_cost)
        if not self.counter.free:
            return BuiltPrompt(header + "".join(parts) + pad * max(0, pads), tokens, tokens, False,
                               self.counter.source, minted[: len(parts)], period)
        actual = 0
        for _ in range(VERIFY_ROUNDS):
            while pads < 0 and parts:  # over: drop whole units from the end, never cut into a canary
                parts.pop()
                pads += round(unit_cost)
            text = header + "".join(parts) + pad * max(0, pads)
            actual = await self.counter.count(text)
            if actual == tokens:
                break
            pads += tokens - actual
        return BuiltPrompt(text, tokens, actual, True, self.counter.source, minted[: len(parts)], period)

    async def _canary_body(self, header: str, budget: int, overhead: int, mint: MintCanaries, page: int,
                           seed: int) -> tuple[list[str], float, tuple[Canary, ...], int]:
        """Units of filler + one canary sentence, short enough that every aligned page (or every run of
        k pages, when one canary is longer than half a page) holds a complete canary."""
        # Costs measured on look-alikes, so that only canaries that go into the prompt are minted (a short
        # sentinel prompt holds one) and a repeated build reuses the measurements.
        costs = [await self._cost(header, CANARY_SENTENCE.format(code=code) + "\n") for code in self._lookalikes]
        canary_cost = max(costs) + 1  # headroom for canaries that tokenize a little longer than the sample
        pages = max(1, -(-(2 * canary_cost - 1) // page))
        period = pages * page
        unit = period - canary_cost + 1  # canary starts at most this far apart
        filler = await self._filler_of(header, unit - canary_cost, seed)
        filler_cost = await self._cost(header, filler) if filler else 0
        mean_unit = filler_cost + sum(costs) / len(costs)
        count = int(budget // mean_unit)
        if count == 0:  # shorter than one unit (a sentinel): one canary after a shorter lead-in
            if budget < canary_cost:
                raise BuildError(f"{budget + overhead} tokens leave no room for a canary (one costs ~{canary_cost})")
            filler = await self._filler_of(header, budget - canary_cost, seed)
            filler_cost = await self._cost(header, filler) if filler else 0
            mean_unit, count = filler_cost + sum(costs) / len(costs), 1
        minted = list(await mint(count))
        parts = [filler + CANARY_SENTENCE.format(code=c.text) + "\n" for c in minted]
        return parts, mean_unit, tuple(minted), period


def _line(words: Sequence[str]) -> str:
    return " ".join(words) + "\n"
