"""How well the timing check of prefix-cache isolation decides, on real engines (CPU, two cores).

For each engine setting, `runs` timing checks of two tenants (both ordered pairs each), exactly as `leakprobe
audit` runs them (prober/probing/timing.py): per run and pair the decision, the Holm-adjusted p-value and the
median TTFT of would-be hits and of misses; then, per setting, the detection rate (pairs found, of all pairs)
and the false-alarm rate (runs with any pair found, of all runs) over the repeated runs.

- vllm-shared: vLLM with prefix caching, no salts: one cache for everyone (should be found).
- vllm-salted: the same server, each tenant's requests with its own `cache_salt` (should not be).
- llamacpp: llama-server, two slots, its default prompt cache (whatever it truly does).
- llamacpp-off: the same with `--no-cache-prompt` (nothing to find).

    python bench/cache_timing.py [runs=5] [samples=24] [prompt_tokens=320] [setting ...]

Needs `make vllm` and `make llama`.  One engine runs at a time; each is stopped by its PID.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from prober.checks.timing import TimingResult, check_timing
from prober.config.sections import TimingSettings
from prober.prompts import detect_counter
from prober.targets import Api, Completion, OpenAICompatible, Prompt, Transport, TransportPolicy
from prober.targets.credentials import Secret
from prober.targets.telemetry import EngineTelemetry
from tests.support.llamacpp import LlamaServer
from tests.support.llamacpp import ensure_installed as llama_installed
from tests.support.vllm import VllmServer
from tests.support.vllm import ensure_installed as vllm_installed

TENANTS = ["tenant-a", "tenant-b"]
KEY = "bench-cache-timing-key"
POLICY = TransportPolicy(timeout_s=300, retries=0)
SETTINGS = ("vllm-shared", "vllm-salted", "llamacpp", "llamacpp-off")


@dataclass(frozen=True)
class Engine:
    url: str
    engine: str  # the tokenizer dialect
    key: str | None
    salted: bool


async def one_run(engine: Engine, settings: TimingSettings) -> TimingResult:
    salts = {t: secrets.token_urlsafe(32) for t in TENANTS} if engine.salted else {}
    async with Transport(POLICY) as transport:
        secret = Secret(engine.key) if engine.key else None
        counter = await detect_counter(transport, engine.url, Api.COMPLETIONS, secret, engine=engine.engine)
        assert counter is not None, "no tokenizer endpoint"
        target = OpenAICompatible("bench", engine.url + "/v1", transport, api=Api.COMPLETIONS)

        async def send(tenant: str, prompt: Prompt) -> Completion:
            return await target.complete(replace(prompt, cache_salt=salts.get(tenant)), secret)

        telemetry = EngineTelemetry(transport, engine.url + "/metrics", secret)
        return await check_timing(send, counter, TENANTS, settings, telemetry=telemetry, rng=random.SystemRandom())


def report(name: str, results: list[TimingResult], seconds: list[float]) -> None:
    decisions = [d for r in results for d in r.decisions]
    for run, result in enumerate(results, 1):
        for d in result.decisions:
            e = d.evidence()
            print(f"  {name:13} run {run}  {d.samples.victim}->{d.samples.observer}  "
                  f"{'FOUND' if d.found else 'clean':5}  p_adj={d.adjusted_p:.2g}  "
                  f"hit_faster={d.hit_faster:.2f}  ttft hit {e['median_ttft_hit_s']} s / miss "
                  f"{e['median_ttft_miss_s']} s  ({len(d.samples.hits)}+{len(d.samples.misses)}, "
                  f"{d.samples.lost} lost, {e['prompt_tokens']} tokens)")
    found_pairs = sum(d.found for d in decisions)
    alarmed_runs = sum(any(d.found for d in r.decisions) for r in results)
    hits = [d.evidence()["median_ttft_hit_s"] for d in decisions]
    misses = [d.evidence()["median_ttft_miss_s"] for d in decisions]
    print(f"{name}: pairs found {found_pairs}/{len(decisions)} ({found_pairs / len(decisions):.0%}), runs with any "
          f"pair found {alarmed_runs}/{len(results)}; median of medians TTFT hit "
          f"{statistics.median(h for h in hits if h is not None):.3f} s, miss "
          f"{statistics.median(m for m in misses if m is not None):.3f} s; "
          f"{statistics.median(seconds):.0f} s a run (median), "
          f"{statistics.median(r.requests for r in results)} requests, "
          f"{statistics.median(r.tokens for r in results):,.0f} prompt tokens")


def measure(name: str, engine: Engine, runs: int, settings: TimingSettings) -> None:
    results, seconds = [], []
    for _ in range(runs):
        began = time.monotonic()
        results.append(asyncio.run(one_run(engine, settings)))
        seconds.append(time.monotonic() - began)
    report(name, results, seconds)


def with_vllm(body: Callable[[Engine, Engine], None]) -> None:
    installation = vllm_installed(log=True)
    began = time.monotonic()
    with VllmServer(installation, api_keys=(KEY,), max_model_len=2048) as server:
        print(f"vLLM healthy after {time.monotonic() - began:.0f} s")
        body(Engine(server.url, "vllm", KEY, False), Engine(server.url, "vllm", KEY, True))


def with_llama(extra: tuple[str, ...], body: Callable[[Engine], None]) -> None:
    with LlamaServer(llama_installed(), ctx_size=8192, parallel=2, extra=extra) as server:
        body(Engine(server.url, "llama.cpp", None, False))


def main(argv: list[str]) -> None:
    runs, samples, tokens = (int(a) for a in (argv + ["5", "24", "320"][len(argv):])[:3])
    chosen = [a for a in argv[3:] if a in SETTINGS] or list(SETTINGS)
    settings = TimingSettings(samples=samples, prompt_tokens=tokens)
    print(f"{runs} runs x 2 ordered pairs, {samples} hits + {samples} misses each, ~{tokens}-token prompts, "
          f"family-wise false-alarm rate {settings.false_alarm}")

    def vllm_body(shared: Engine, salted: Engine) -> None:
        for name, engine in (("vllm-shared", shared), ("vllm-salted", salted)):
            if name in chosen:
                measure(name, engine, runs, settings)

    if {"vllm-shared", "vllm-salted"} & set(chosen):
        with_vllm(vllm_body)
    for name, extra in (("llamacpp", ()), ("llamacpp-off", ("--no-cache-prompt",))):
        if name in chosen:
            with_llama(extra, lambda engine, name=name: measure(name, engine, runs, settings))

if __name__ == "__main__":
    main(sys.argv[1:])
