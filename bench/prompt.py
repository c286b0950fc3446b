"""Building token-exact prompts: how long a 1,048,576-token prompt takes to build, and how much memory.

The counter is the reference engine's tokenizer in this process (no HTTP), so the figure is the builder's
own cost: measuring segments, minting and persisting canaries (SQLite in memory), assembling, and counting
the whole prompt once to verify it.  Baseline in the
same run: the naive loop of appending filler sentences and re-counting until the length is reached.

    python bench/prompt.py
"""

from __future__ import annotations

import asyncio
import statistics
import time
import tracemalloc
from collections.abc import Callable

from prober.canaries.filler import load_filler
from prober.canaries.mint import Minter
from prober.domain.types import Canary
from prober.ledger import open_ledger
from prober.prompts import LocalCounter, PromptBuilder
from prober.testbed import tokenizer

TARGET = 1_048_576


def naive(tokens: int) -> str:
    """Append a sentence and count the whole text again every 1,000 sentences, then trim by words."""
    text = "Quote the document.\n"
    sentences = load_filler("en").sentences(0)
    while True:
        text += " ".join(next(sentences) for _ in range(1_000)) + " "
        if tokenizer.count(text) >= tokens:
            break
    words = text.split(" ")
    while tokenizer.count(" ".join(words)) > tokens:
        words = words[: -max(1, (tokenizer.count(" ".join(words)) - tokens) // 2)]
    return " ".join(words)


async def build(tokens: int, canaries: bool = False) -> int:
    builder = PromptBuilder(LocalCounter(tokenizer.count))
    minter = Minter(open_ledger(":memory:"), b"bench-key-bench-key-bench-key-32")

    async def mint(n: int) -> list[Canary]:
        return minter.tokens("tenant-a", n)

    built = await builder.build(tokens, instruction="Quote the document.", page_size=64,
                                mint=mint if canaries else None)
    assert built.exact, (built.tokens, tokens)
    return len(built.canaries)


def timed(fn: Callable[[], object], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    plain = timed(lambda: asyncio.run(build(TARGET)))
    dense = timed(lambda: asyncio.run(build(TARGET, canaries=True)))
    baseline = timed(lambda: naive(TARGET), runs=3)
    tracemalloc.start()
    count = asyncio.run(build(TARGET, canaries=True))
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    print(f"{TARGET:,}-token prompt, exact, median of 5:")
    print(f"  filler only             {plain:6.3f} s")
    print(f"  canary in every window  {dense:6.3f} s  ({count:,} canaries, page 64)")
    print(f"  naive append-and-count  {baseline:6.3f} s  (median of 3, not exact to the token)  "
          f"-> builder {baseline / plain:.1f}x faster")
    print(f"  peak traced memory (canary-dense build): {peak:.0f} MiB")


if __name__ == "__main__":
    main()
