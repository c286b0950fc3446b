"""The engine's own Prometheus metrics, read right before and right after a probe, and between probes.

A leak is an HTTP 200 like any other; what the engine counted meanwhile often says why: an abort the
hand-off did not see (SGLang `num_aborted_requests`), KV usage, preemptions, prefix-cache hits.  Only the
series that can explain a leak are kept, summed over their labels (model, engine, rank), except where a
label is the point (vLLM's `finished_reason` and `source`).

On a shared endpoint every window also holds other users' requests: their disconnects and over-long prompts are
aborts too.  So each read notes which process answered (`process_start_time_seconds`: a `/metrics` balanced
across replicas answers from either) and what this process had out then (its outbox), a window says why it is
not evidence about its own requests (another replica answered, a counter went back, another of our requests ran
in it), and the stretches between reads with none of our requests out are kept as the counters' background.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from prober.domain.evidence import Change, EngineCounters
from prober.targets.credentials import Secret
from prober.targets.transport import Transport

# Sample names (as exposed) that explain a leak, by engine.
EXPLAINING = frozenset({
    # SGLang (--enable-metrics)
    "sglang:num_aborted_requests_total", "sglang:token_usage", "sglang:num_running_reqs",
    "sglang:num_queue_reqs", "sglang:cache_hit_rate", "sglang:cached_tokens_total",
    "sglang:num_retracted_reqs", "sglang:prompt_tokens_total", "sglang:num_transfer_failed_reqs_total",
    "sglang:num_bootstrap_failed_reqs_total",
    # vLLM
    "vllm:num_preemptions_total", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
    "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:num_requests_running",
    "vllm:num_requests_waiting", "vllm:request_success_total", "vllm:prompt_tokens_total",
    # vLLM's KV connectors: blocks a connector says it received rather than computed
    "vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total",
    "vllm:prompt_tokens_by_source_total", "vllm:nixl_num_failed_transfers_total",
    # leakprobe's own fire drill, loaded into vLLM (prober/drill): an engine that leaks on purpose says so
    "vllm:leakprobe_drill_claim_over_tokens",
    # llama.cpp (--metrics)
    "llamacpp:kv_cache_usage_ratio", "llamacpp:kv_cache_tokens", "llamacpp:requests_processing",
    "llamacpp:requests_deferred", "llamacpp:prompt_tokens_total",
})
# Counters that rise when the engine gave up on a request or its KV transfer: one that rose while every answer in
# the window came back served says the engine failed a request that its client was told succeeded.
FAILURES = frozenset({
    "sglang:num_aborted_requests_total", "sglang:num_transfer_failed_reqs_total",
    "sglang:num_bootstrap_failed_reqs_total", 'vllm:request_success_total{finished_reason="abort"}',
    "vllm:nixl_num_failed_transfers_total",
})
# Counters that rise with every prompt the engine takes (a prompt served whole from its prefix cache too): none of them
# moving while an answer of ours came back says that no engine made it.
PROMPTS = frozenset({"sglang:prompt_tokens_total", "vllm:prompt_tokens_total", "llamacpp:prompt_tokens_total"})
KEPT_LABELS = frozenset({"finished_reason", "source"})
PREFIXES = ("sglang:", "vllm:", "llamacpp:")
SOURCE = "process_start_time_seconds"  # which process answered a read (client_python exports it on Linux)
SAME_SOURCE_TRIES = 3  # reads of an after-snapshot until the process that answered the before one answers again
BACKGROUND_S = 3_600.0  # how far back the background goes: other users' rate changes over a day
SOURCES_KEPT = 16  # processes whose last reading is kept: replicas behind one address (a changing source is not one)


@dataclass(frozen=True)
class Reading:
    """One read of the engine's counters."""

    values: dict[str, float]
    at: float  # time.monotonic()
    source: float | None  # the answering process's start time, where the engine exports it
    started: int  # this process's generation requests to the target started by then
    out: int  # of those, still out then


def parse(text: str) -> tuple[dict[str, float], float | None]:
    """The explaining series of an exposition, and the answering process's start time; a line that does not parse
    ends the parse (what was read stays): a target's /metrics is not trusted to be well formed."""
    values: dict[str, float] = {}
    source: float | None = None
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == SOURCE:
                    source = float(sample.value)
                if sample.name not in EXPLAINING:
                    continue
                kept = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k in KEPT_LABELS)
                name = f"{sample.name}{{{kept}}}" if kept else sample.name
                values[name] = values.get(name, 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError):
        pass
    return values, source


def changes(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Change]:
    return {name: Change.between(before[name], after[name]) for name in sorted(before.keys() & after.keys())}


def incomparable(before: Reading, after: Reading) -> str | None:
    """Why two readings say nothing about what happened between them, or None."""
    if before.source is not None and after.source is not None and before.source != after.source:
        return (f"before and after came from different engine processes (started at {before.source:.0f} and "
                f"{after.source:.0f}): /metrics is balanced across replicas, so no delta was taken")
    fell = sorted(name for name in FAILURES if after.values.get(name, 0.0) < before.values.get(name, 0.0))
    if fell:
        return f"{fell[0]} went down (the engine restarted, or another replica answered): no delta was taken"
    return None


@dataclass
class Window:
    """What the engine counted while some requests ran: filled in when the window closes (empty where the engine
    exposes nothing).  `problem`: why its deltas are not evidence about those requests."""

    requests: int  # ours in it
    changed: dict[str, Change] | None = None
    seconds: float = 0.0
    problem: str | None = None

    def evidence(self) -> EngineCounters | None:
        return EngineCounters(dict(self.changed)) if self.changed else None

    def took_no_prompt(self) -> bool | None:
        """The engine process read counted no prompt while the window's requests ran: it made none of their answers.
        Other users' prompts in the window make it False; None where the window has no prompt counter to read."""
        taken = [c.delta for name, c in (self.changed or {}).items() if name in PROMPTS]
        return not any(taken) if taken else None

    def failures(self) -> dict[str, float]:
        """The failure counters that rose, by how much."""
        return {name: c.delta for name, c in (self.changed or {}).items() if name in FAILURES and c.delta > 0}


@dataclass
class Background:
    """Failure-counter events in stretches with none of this process's requests to the target out: other users'
    rate, which a rise in our own windows is tested against."""

    stretches: deque[tuple[float, float, dict[str, float]]] = field(default_factory=deque)  # (end, seconds, rises)

    def add(self, end: float, seconds: float, rises: dict[str, float]) -> None:
        self.stretches.append((end, seconds, rises))
        while self.stretches and end - self.stretches[0][0] > BACKGROUND_S:
            self.stretches.popleft()

    @property
    def seconds(self) -> float:
        return sum(s for _, s, _ in self.stretches)

    def events(self, name: str) -> float:
        return sum(rises.get(name, 0.0) for _, _, rises in self.stretches)


@asynccontextmanager
async def window(telemetry: EngineTelemetry | None, requests: int = 1) -> AsyncIterator[Window]:
    """The engine's counters read right before and right after the block, which sends `requests` of ours: every
    probe's evidence comes from here."""
    opened = Window(requests)
    before = await telemetry.read() if telemetry else None
    yield opened
    if telemetry is None or before is None:
        return
    after = await telemetry.read(like=before)
    if after is None:
        return
    opened.seconds = after.at - before.at
    opened.problem = incomparable(before, after)
    if opened.problem is None and (before.out or after.started - before.started > requests):
        opened.problem = "other requests of this process to the target ran in the same window"
    opened.changed = changes(before.values, after.values) if opened.problem is None else None


class EngineTelemetry:
    """Reads `metrics_url` with the tenant's credential; each read that follows one of the same engine process with
    none of this process's generation requests out in between adds that stretch to the background (replicas
    balanced in turn behind one address answer reads alternately: each is compared with its own last)."""

    def __init__(self, transport: Transport, metrics_url: str, secret: Secret | None) -> None:
        self.transport = transport
        self.metrics_url = metrics_url
        self.secret = secret
        self.background = Background()
        self._last: dict[float | None, Reading] = {}  # by the process that answered it

    async def read(self, like: Reading | None = None) -> Reading | None:
        """The explaining series now, or None when the engine exposes none (or not now).  `like`: read again, a
        few times, while another process than that reading's answers (a /metrics balanced across replicas)."""
        reading = await self._read()
        for _ in range(SAME_SOURCE_TRIES - 1):
            if like is None or reading is None or reading.source in (None, like.source):
                break
            reading = await self._read()
        return reading

    async def quiet(self, seconds: float) -> None:
        """Read, wait, read: a stretch of background, if none of this process's requests start meanwhile."""
        await self.read()
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(left, 5.0))
            await self.read()

    async def _read(self) -> Reading | None:
        outbox = self.transport.outbox
        started, out = outbox.started, outbox.out
        exchange = await self.transport.exchange("GET", self.metrics_url, secret=self.secret)
        if exchange.error is not None or exchange.status != 200:
            return None
        text = exchange.body.decode("utf-8", "replace")
        if not any(prefix in text for prefix in PREFIXES):
            return None
        values, source = parse(text)
        if not values:
            return None
        # What was out when the read began, and what had started when it ended: the stretch before it is quiet
        # only if nothing of ours was out at either end and nothing started in between.
        reading = Reading(values, time.monotonic(), source, outbox.started, max(out, outbox.out))
        last = self._last.pop(source, None)
        self._last[source] = reading
        if len(self._last) > SOURCES_KEPT:
            del self._last[next(iter(self._last))]
        if (last is not None and last.out == 0 and reading.out == 0 and reading.started == started == last.started
                and incomparable(last, reading) is None):
            rises = {name: d for name in FAILURES if (d := values.get(name, 0.0) - last.values.get(name, 0.0)) > 0}
            self.background.add(reading.at, reading.at - last.at, rises)
        return reading

