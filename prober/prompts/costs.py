"""What a segment of a prompt costs in the target's tokens, measured through its counter as a difference against
the prompt's header (so the chat template and BOS cancel out), each text counted once; and filler that costs an
exact number of tokens."""

from __future__ import annotations

from collections.abc import Sequence

from prober.canaries.filler import load_filler
from prober.domain.errors import BuildError
from prober.prompts.counter import TokenCounter

PAD_CANDIDATES = (" the", " and", " a", " of", " to")
# A filler's next guess aims a little short of what the tokens per word measured so far say, so that it seldom
# overshoots.
INTERPOLATION_UNDERSHOOT = 0.97


class SegmentCosts:
    def __init__(self, counter: TokenCounter, language: str = "en") -> None:
        self.counter = counter
        self.filler = load_filler(language)
        self._counts: dict[str, int] = {}
        self._pad: str | None = None
        self._tokens_per_word = 1.3  # the filler's, as last measured through this counter

    async def count(self, text: str) -> int:
        if text not in self._counts:
            self._counts[text] = await self.counter.count(text)
        return self._counts[text]

    async def cost(self, header: str, segment: str) -> int:
        return await self.count(header + segment) - await self.count(header)

    async def pad(self, header: str) -> str:
        """A word that costs exactly one token, also when repeated."""
        if self._pad is None:
            for word in PAD_CANDIDATES:
                # Measured after one pad word: a chat template that trims the message (Gemma's) drops the
                # header's final line break from a count that ends there.
                if await self.cost(header + word, word) == 1 and await self.cost(header + word, word * 16) == 16:
                    self._pad = word
                    break
            else:
                raise BuildError(f"no single-token pad word among {PAD_CANDIDATES!r} for this tokenizer")
        return self._pad

    async def filler_of(self, header: str, tokens: int, seed: int) -> str:
        """Filler sentences costing exactly `tokens`: the most whole words that fit, then pad words.  Each count is
        a request, so the next guess comes from the tokens per word measured so far, and halving only follows a
        guess that overshot.  The text is the same as halving alone finds (a model reads it), in fewer counts."""
        pad = await self.pad(header)
        if tokens <= 0:
            return ""
        words = self.filler.text(tokens * 8, seed).split(" ")
        fits, cost, over = 0, 0, min(len(words), tokens) + 1  # words[:fits] costs `cost`; words[:over] does not fit
        overshot = False
        while over - fits > 1 and cost < tokens:  # a word costs a token or more: at `tokens`, no other fits
            if overshot:  # the estimate was high: halve what is left
                guess = (fits + over) // 2
            else:
                guess = fits + max(1, int(INTERPOLATION_UNDERSHOOT * (tokens - cost) / self._tokens_per_word))
            guess = min(guess, over - 1)
            measured = await self.cost(header, line(words[:guess]))
            self._tokens_per_word = max(1.0, measured / guess)
            overshot = measured > tokens
            if overshot:
                over = guess
            else:
                fits, cost = guess, measured
        text = line(words[:fits])
        if not fits:  # the line break alone
            cost = await self.cost(header, text)
        return text.removesuffix("\n") + pad * (tokens - cost) + "\n"


def line(words: Sequence[str]) -> str:
    """Words as one filler line, ending in a line break (costs stay additive)."""
    return " ".join(words) + "\n"
