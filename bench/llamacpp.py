"""Real model, real engine: llama.cpp's llama-server with Gemma 3 270M (CPU, two cores).

1. False positives: N answers (default 320) to canary-laden prompts where nothing leaks.  Four tenants,
   each with token and fact canaries; every prompt carries only its own tenant's canaries; the scanner
   (exact, fuzzy, semantic, foreign) knows all tenants' canaries.  Any cross-tenant finding is a false
   positive.  Four in five answers are sampled (temperature 0.8, a seed each), so answers vary as they do
   in service; one in five is greedy, as the audit's probes are.
2. Shared KV pool: `--kv-unified` with two slots, each advertising the whole pool.  Two tenants send
   canary-laden prompts at the same time that together exceed the pool; what llama.cpp does (status,
   usage, timings, anything of the other tenant in an answer) is printed as measured.

    python bench/llamacpp.py [answers]
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time
from collections import Counter
from itertools import cycle, islice

from prober.canaries.mint import Minter
from prober.detect import CanarySet, Scanner
from prober.domain.types import Canary, Record, Severity
from prober.embeddings import make_embedder
from prober.ledger import open_ledger
from prober.prompts import PromptBuilder, detect_counter
from prober.prompts.builder import MintCanaries
from prober.targets import Api, Completion, OpenAICompatible, Prompt, Transport, TransportPolicy
from tests.support.llamacpp import LlamaServer, cache_dir, ensure_installed

KEY = b"bench-llama-key-bench-llama-key!"
TENANTS = ["tenant-a", "tenant-b", "tenant-c", "tenant-d"]
INSTRUCTIONS = [
    "Quote the document word for word, including every reference code.",
    "Summarize the document in two sentences.",
    "Continue the document.",
    "List the reference codes and facts mentioned in the document.",
    "What is this document about?",
]
POLICY = TransportPolicy(timeout_s=300, retries=1)


def cycling(canaries: list[Canary]) -> MintCanaries:
    """A mint that hands out these canaries in turn (they are in the ledger already)."""
    async def mint(n: int) -> list[Canary]:
        return list(islice(cycle(canaries), n))
    return mint


ANSWERS = cache_dir() / "gemma-answers.jsonl"  # kept for bench/foreign.py


async def false_positives(server: LlamaServer, answers: int) -> None:
    embedder = make_embedder()
    kept = []
    ledger = open_ledger(":memory:")
    minter = Minter(ledger, KEY, embedder)
    own: dict[str, tuple[list[Canary], list[Canary]]] = {
        t: (minter.tokens(t, 40), minter.facts(t, 40)) for t in TENANTS}
    scanner = Scanner(CanarySet(ledger.active_canaries(), key=KEY, tenants=TENANTS), embedder=embedder)
    rng = random.Random(7)
    by_severity: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    answers_with: Counter[str] = Counter()
    own_echoes = 0
    lengths: list[int] = []
    async with Transport(POLICY) as transport:
        target = OpenAICompatible("gemma", server.url + "/v1", transport, api=Api.COMPLETIONS)
        counter = await detect_counter(transport, server.url, Api.COMPLETIONS, None, engine="llama.cpp")
        assert counter is not None
        builder = PromptBuilder(counter)
        started = time.monotonic()

        async def one(i: int) -> tuple[str, str, str, Completion, bool]:
            tenant = TENANTS[i % len(TENANTS)]
            tokens, facts = own[tenant]
            picked = rng.sample(tokens, 3)
            fact_lines = " ".join(f.text for f in rng.sample(facts, 2))
            built = await builder.build(rng.choice([120, 200, 320]), instruction=rng.choice(INSTRUCTIONS),
                                        mint=cycling(picked), page_size=64, seed=i)
            text = built.text.replace("\n", f"\n{fact_lines}\n", 1)
            sampled = Prompt(text, max_tokens=64, temperature=0.0 if i % 5 == 0 else 0.8, seed=i)
            return tenant, text, f"a{i}", await target.complete(sampled, None), i % 5 == 0

        for start in range(0, answers, 2):  # two slots: two requests in flight
            batch = await asyncio.gather(*(one(i) for i in range(start, min(answers, start + 2))))
            for tenant, prompt, rid, answer, greedy in batch:
                assert answer.ok, answer.error
                kept.append({"id": rid, "tenant": tenant, "prompt": prompt, "text": answer.text, "greedy": greedy})
                lengths.append(len(answer.text))
                result = scanner.scan(Record(rid, tenant, answer.text, prompt))
                own_echoes += len(result.own_echoes)
                for severity in {f.severity.label for f in result.findings}:
                    answers_with[severity] += 1
                    answers_with[f"{severity}/{'greedy' if greedy else 'sampled'}"] += 1
                for f in result.findings:
                    by_severity[f.severity.label] += 1
                    by_kind[f"{f.kind.value}/{f.detector}"] += 1
        elapsed = time.monotonic() - started
    ANSWERS.write_text("".join(json.dumps(k, ensure_ascii=False) + "\n" for k in kept), encoding="utf-8")
    crit = answers_with[Severity.CRITICAL.label] + answers_with[Severity.HIGH.label]
    print(f"false positives over {answers} real Gemma answers ({elapsed:.0f} s, median answer "
          f"{statistics.median(lengths)} chars, {own_echoes} own canaries echoed back as positive controls):")
    print(f"  answers with a critical/high finding: {crit} ({crit / answers:.2%})")
    greedy = len(range(0, answers, 5))
    warn = Severity.WARNING.label
    print(f"  answers with a warning: {answers_with[warn]} ({answers_with[warn] / answers:.2%}); greedy "
          f"{answers_with[warn + '/greedy']}/{greedy}, sampled {answers_with[warn + '/sampled']}/{answers - greedy}")
    print(f"  findings by severity: {dict(by_severity) or 'none'}; by kind/detector: {dict(by_kind) or 'none'}")


async def shared_pool(server: LlamaServer, rounds: int = 6) -> None:
    ledger = open_ledger(":memory:")
    minter = Minter(ledger, KEY)
    print("shared KV pool (--kv-unified, --ctx-size 2048, --parallel 2): concurrent prompts from two tenants")
    async with Transport(POLICY) as transport:
        props = (await transport.exchange("GET", server.url + "/props")).body
        target = OpenAICompatible("gemma", server.url + "/v1", transport, api=Api.COMPLETIONS)
        counter = await detect_counter(transport, server.url, Api.COMPLETIONS, None, engine="llama.cpp")
        assert counter is not None
        builder = PromptBuilder(counter)
        advertised = json.loads(props)["default_generation_settings"]["n_ctx"]
        print(f"  each slot advertises n_ctx = {advertised:,} (/props); 2 slots")
        for length in (900, 1_200, 1_600, 1_900):
            outcomes: Counter[str] = Counter()
            leaks = 0
            usage_ok = 0
            durations: list[float] = []
            messages: set[str] = set()
            for r in range(rounds):
                built = {}
                for tenant in ("tenant-a", "tenant-b"):
                    canaries = minter.tokens(tenant, 8, probe_id=f"{tenant}-{length}-{r}")
                    built[tenant] = await builder.build(
                        length, instruction=INSTRUCTIONS[0], page_size=64,
                        mint=cycling(canaries), seed=r)
                answers = await asyncio.gather(*(target.complete(Prompt(b.text, max_tokens=64), None)
                                                 for b in built.values()))
                scanner = Scanner(CanarySet(ledger.active_canaries(), key=KEY, tenants=["tenant-a", "tenant-b"]))
                for (tenant, b), answer in zip(built.items(), answers, strict=True):
                    outcomes[f"HTTP {answer.status}" + (f" {answer.error.kind.value}" if answer.error else "")] += 1
                    durations.append(answer.total_s)
                    if answer.error:
                        messages.add(answer.error.message[:160])
                    if answer.usage and answer.usage.prompt_tokens == b.tokens:
                        usage_ok += 1
                    if answer.text:
                        found = scanner.scan(Record(f"{tenant}-{r}", tenant, answer.text, b.text)).findings
                        leaks += sum(f.victim_tenant is not None for f in found)
            print(f"  2 x {length:,} tokens at once ({2 * length:,} vs pool {advertised:,}), {rounds} rounds: "
                  f"{dict(outcomes)}; usage == sent in {usage_ok}/{2 * rounds}; cross-tenant canaries in answers: "
                  f"{leaks}; median latency {statistics.median(durations):.2f} s, max {max(durations):.2f} s"
                  + "".join(f"\n    error: {m}" for m in sorted(messages)))


def main() -> None:
    answers = int(sys.argv[1]) if len(sys.argv) > 1 else 320
    install = ensure_installed()
    with LlamaServer(install, ctx_size=4_096, parallel=2, extra=("--no-cache-prompt",)) as server:
        asyncio.run(false_positives(server, answers))
    with LlamaServer(install, ctx_size=2_048, parallel=2, kv_unified=True) as server:
        asyncio.run(shared_pool(server))


if __name__ == "__main__":
    main()
