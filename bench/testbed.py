"""How long the reference engine takes for a prompt just under the advertised context (about 1M
tokens), over real HTTP, and how much memory the process holds.  Run by hand: `python bench/testbed.py`.

Baseline in the same run: a 1,000-token request (the fixed cost of HTTP + JSON + model).
"""

from __future__ import annotations

import asyncio
import resource
import statistics
import time

import httpx

from prober.prompts import LocalCounter, PromptBuilder
from prober.testbed import TestbedServer, build_config, tokenizer

KEY = {"Authorization": "Bearer testbed-key-a"}


def prompt_of(tokens: int) -> str:
    builder = PromptBuilder(LocalCounter(tokenizer.count))
    return asyncio.run(builder.build(tokens, instruction="Quote the document.")).text


def timed(client: httpx.Client, prompt: str, runs: int) -> tuple[float, int]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        r = client.post("/v1/completions", headers=KEY, json={"prompt": prompt, "max_tokens": 64})
        r.raise_for_status()
        times.append(time.perf_counter() - started)
    return statistics.median(times), r.json()["usage"]["prompt_tokens"]


def main() -> None:
    for preset in ("healthy", "incident"):
        with TestbedServer(build_config(preset)) as server, httpx.Client(base_url=server.url, timeout=300) as c:
            small, n_small = timed(c, prompt_of(1_000), 5)
            big, n_big = timed(c, prompt_of(1_048_000), 5)
            print(f"{preset:9s} {n_small:>9,} tokens: median {small * 1000:7.1f} ms   "
                  f"{n_big:>9,} tokens: median {big:5.2f} s   ratio {big / small:6.0f}x")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process (client + engine): {rss:.0f} MiB")


if __name__ == "__main__":
    main()
