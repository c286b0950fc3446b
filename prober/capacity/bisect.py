"""Finding the accept/refuse boundary when the engine will not say: exponential search up, then binary
search between the longest prompt served and the shortest refused, within a token budget."""

from __future__ import annotations

from dataclasses import dataclass

from prober.capacity.limits import Known
from prober.domain.errors import BuildError
from prober.prompts.builder import PromptBuilder
from prober.targets.base import Prompt, Target
from prober.targets.credentials import Secret

INSTRUCTION = "Reply with the single word ok."


@dataclass
class Bisection:
    served: int | None = None  # longest prompt served
    refused: int | None = None  # shortest prompt refused
    requests: int = 0
    tokens_spent: int = 0
    stopped: str = ""  # why it ended early, if it did

    def known(self) -> Known | None:
        if self.served is None:
            return None
        bound = f"{self.refused:,} refused" if self.refused else "no refusal found"
        return Known(self.served, f"bisection ({self.served:,} served, {bound}; {self.requests} requests, "
                                  f"{self.tokens_spent:,} tokens)")


async def bisect_accept_limit(target: Target, builder: PromptBuilder, secret: Secret | None, *, budget: int,
                              start: int = 1_024, ceiling: int = 4_194_304) -> Bisection:
    result = Bisection()
    length = start
    while result.refused is None or (result.served or 0) + 1 < result.refused:
        if result.refused is not None:
            length = ((result.served or 0) + result.refused) // 2
        if result.tokens_spent + length > budget:
            result.stopped = f"token budget of {budget:,} reached"
            break
        try:
            built = await builder.build(length, instruction=INSTRUCTION)
        except BuildError as exc:
            result.stopped = str(exc)
            break
        answer = await target.complete(Prompt(built.text, max_tokens=1), secret)
        result.requests += 1
        result.tokens_spent += length
        if answer.served:
            result.served = length
            if result.refused is None:
                if length >= ceiling:
                    result.stopped = f"served at the {ceiling:,}-token ceiling"
                    break
                length = min(length * 2, ceiling)
        elif answer.refused and answer.error is not None:
            result.refused = length
            if result.served is None:
                result.stopped = f"even {length:,} tokens were refused: {answer.error.message}"
                break
        else:
            result.stopped = f"probe of {length:,} tokens failed: {answer.error}"
            break
    return result
