"""The engine's own Prometheus metrics, read right before and right after a probe.

A leak is an HTTP 200 like any other; what the engine counted meanwhile often says why: an abort the
hand-off did not see (SGLang `num_aborted_requests`), KV usage, preemptions, prefix-cache hits.  Only the
series that can explain a leak are kept, summed over their labels (model, engine, rank), except where a
label is the point (vLLM's `finished_reason` and `source`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from prober.targets.credentials import Secret
from prober.targets.transport import Transport

Snapshot = dict[str, float]

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
    "vllm:num_requests_waiting", "vllm:request_success_total",
    # vLLM's KV connectors: blocks a connector says it received rather than computed
    "vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total",
    "vllm:prompt_tokens_by_source_total", "vllm:nixl_num_failed_transfers_total",
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
KEPT_LABELS = frozenset({"finished_reason", "source"})
PREFIXES = ("sglang:", "vllm:", "llamacpp:")


def parse(text: str) -> Snapshot:
    """The explaining series of an exposition; a line that does not parse ends the parse (what was read
    stays): a target's /metrics is not trusted to be well formed."""
    snapshot: Snapshot = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in EXPLAINING:
                    continue
                kept = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k in KEPT_LABELS)
                name = f"{sample.name}{{{kept}}}" if kept else sample.name
                snapshot[name] = snapshot.get(name, 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError):
        pass
    return snapshot


@dataclass(frozen=True)
class Change:
    before: float
    after: float

    @property
    def delta(self) -> float:
        return self.after - self.before

    def to_json(self) -> dict[str, float]:
        return {"before": self.before, "after": self.after, "delta": round(self.delta, 6)}


def changes(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Change]:
    return {name: Change(before[name], after[name]) for name in sorted(before.keys() & after.keys())}


@dataclass
class Window:
    """What the engine counted while some requests ran: filled in when the window closes (empty where the engine
    exposes nothing)."""

    changed: dict[str, Change] | None = None

    def evidence(self) -> dict[str, dict[str, float]] | None:
        return {name: change.to_json() for name, change in self.changed.items()} if self.changed else None

    def failures(self) -> dict[str, float]:
        """The failure counters that rose, by how much."""
        return {name: c.delta for name, c in (self.changed or {}).items() if name in FAILURES and c.delta > 0}


@asynccontextmanager
async def window(telemetry: EngineTelemetry | None) -> AsyncIterator[Window]:
    """The engine's counters read right before and right after the block: every probe's evidence comes from here."""
    opened = Window()
    before = await telemetry.snapshot() if telemetry else None
    yield opened
    after = await telemetry.snapshot() if telemetry and before else None
    opened.changed = changes(before, after) if before and after else None


class EngineTelemetry:
    """Reads `metrics_url` with the tenant's credential; `available` once a read found engine series."""

    def __init__(self, transport: Transport, metrics_url: str, secret: Secret | None) -> None:
        self.transport = transport
        self.metrics_url = metrics_url
        self.secret = secret

    async def snapshot(self) -> Snapshot | None:
        """The explaining series now, or None when the engine exposes none (or not now)."""
        exchange = await self.transport.exchange("GET", self.metrics_url, secret=self.secret)
        if exchange.error is not None or exchange.status != 200:
            return None
        text = exchange.body.decode("utf-8", "replace")
        if not any(prefix in text for prefix in PREFIXES):
            return None
        return parse(text) or None
