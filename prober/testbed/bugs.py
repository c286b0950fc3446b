"""How serving engines have leaked one request's state into another, as the reference engine reproduces each: the
public bug, the fault that models it, the probe of leakprobe's plan that catches it, and what it reports.

One table, read by the docs (docs/hooks/bugs.py renders it into docs/testbed.md) and by the tests
(tests/test_engine_bugs.py runs every row against its fault and against the fault-free engine), so a row
cannot be documented without being tested.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prober.domain.types import FindingKind

# Each tenant's canary adapter, by the name requests select it with: the target's `adapters:`, and the adapters the
# reference engine serves (each answering its trigger with the canary the deployment key derives for its tenant).
ADAPTERS = {"tenant-a": "adapter-a", "tenant-b": "adapter-b"}


@dataclass(frozen=True)
class EngineBug:
    public: str  # the engines' own trackers: repository and issue or PR numbers
    what: str  # what went wrong, in one line
    faults: dict[str, bool]  # the reference engine's `faults:` that reproduce it
    probe: str  # the part of leakprobe's plan that catches it
    kind: FindingKind
    checks: tuple[str, ...] = ()  # the registered checks whose runs catch it (none: every check that reads answers)
    engine: dict[str, Any] = field(default_factory=dict)  # the reference engine's other settings it needs
    audit: dict[str, Any] = field(default_factory=dict)  # what the target's config needs beyond its defaults
    real_lm: bool = False  # the real-LM mode shows it too (tests/test_testbed_reallm.py)


BUGS = (
    EngineBug("SGLang #30233, #38704, #38935", "an over-long prompt aborted into a 1-token placeholder that the "
              "prefill-to-decode hand-off forwards; decode attends over pages it never received (the incident)",
              {"abort_flag_unsynced": True, "decode_skips_page_check": True},
              "boundary probes just over the KV pool, primed by a canary-dense prompt", FindingKind.CROSS_TENANT_ECHO,
              checks=("campaign",), real_lm=True),
    EngineBug("SGLang #33507, #35421", "an aborted request answered HTTP 200 with `finish_reason: length` (or "
              "garbage) instead of an error", {"usage_reports_placeholder": True},
              "boundary probes over the pool, with the engine's counters read around each (SGLang's "
              "`num_aborted_requests`)", FindingKind.COUNTED_FAILURE, checks=("campaign",)),
    EngineBug("SGLang #33507, under vLLM's counters", "the same HTTP 200 for an abort, on an engine that exports "
              "vLLM's metrics (`request_success{finished_reason=\"abort\"}`, `nixl_num_failed_transfers`)",
              {"usage_reports_placeholder": True},
              "boundary probes over the pool, with the engine's counters read around each (vLLM's "
              "`request_success{finished_reason=\"abort\"}`)", FindingKind.COUNTED_FAILURE, checks=("campaign",),
              engine={"metrics": "vllm"}),
    EngineBug("vLLM #16016, CVE-2025-46570", "one prefix cache for every tenant: another tenant's prompt is served "
              "from cache, and answers sooner", {"shared_prefix_cache": True},
              "the prefix-cache check: the observer resends the victim's prompt; timing: it answers sooner",
              FindingKind.CROSS_TENANT_CACHE_HIT, checks=("prefix-cache", "timing")),
    EngineBug("SGLang #26747 → #37058 → #38577, #37160; LMCache #4825", "a storage tier keyed without the tenant's "
              "namespace or cache salt: tenant B reads tenant A's pages back", {"storage_tier_ignores_salt": True},
              "the prefix-cache check with a cache salt per tenant", FindingKind.CROSS_TENANT_CACHE_HIT,
              checks=("prefix-cache",), audit={"cache_salt": "per-tenant"}),
    EngineBug("vLLM #50630, llama.cpp #28056", "an identical request after one with another prefix carries the "
              "intervening request's content (A, X, A)", {"cache_hit_reads_stale_pages": True},
              "the repeat check: the observer's prompt, the victim's, the observer's again",
              FindingKind.CROSS_TENANT_ECHO, checks=("prefix-cache",)),
    EngineBug("SGLang #24527, #35049, #38961", "decode freed KV pages while a write to them was in flight: the next "
              "request held the first one's KV, with no error anywhere", {"frees_pages_while_written": True},
              "the cross-talk burst: every tenant's short requests at once, each answer checked for the others' "
              "canaries", FindingKind.CROSS_TENANT_ECHO, checks=("crosstalk",)),
    EngineBug("vLLM #45704, #47282", "KV pages restored from the CPU offload tier before their copy landed (load and "
              "store not ordered with compute): no error or crash, the answers turn to mixed-script salad",
              {"offload_restore_unsynced": True},
              "every answer, judged by itself: the garbled-output detector", FindingKind.GARBLED_OUTPUT),
    EngineBug("llama.cpp #27148, #27624", "a fresh request for an unrelated prompt served from a slot that still "
              "holds an earlier, finished conversation, with 0 tokens reported cached",
              {"idle_slot_keeps_conversation": True},
              "the idle-slot check: the victim's conversations in every slot, then the observer's cold prompts one "
              "at a time and all at once", FindingKind.CROSS_TENANT_ECHO, checks=("idle-slots",),
              engine={"mode": "monolithic", "slots": 2, "context_length": 4_096, "pool_tokens": 8_192},
              audit={"capacity": {"slots": 2}}),
    EngineBug("SGLang PR #19035, vLLM #10583, modelcontextprotocol/python-sdk #3060", "requests in flight kept "
              "under the ID the client sent: two tenants' requests under one ID share one entry, and one of them is "
              "handed the other's answer", {"keys_requests_by_client_id": True},
              "the request-ID check: every tenant's requests at once under one client request ID (header and body "
              "field), each answer checked for the others' canaries", FindingKind.CROSS_TENANT_ECHO,
              checks=("request-ids",), engine={"decode_ms_per_token": 1}),
    EngineBug("vLLM PR #56525, #52234", "a prompt's cache entries published before its KV is written: after a "
              "client abort mid-prefill, the retry takes the never-written pages as cached and reads what they "
              "held, another tenant's KV", {"publishes_before_written": True},
              "the abort-and-retry check: the observer's prompt abandoned mid-prefill, the same prompt and then its "
              "own from the victim, the observer's retry", FindingKind.CROSS_TENANT_ECHO, checks=("abort-retry",),
              engine={"prefill_ms_per_1k_tokens": 100}),
    EngineBug("vLLM #30931, #42125, #44250; llama.cpp #26207; SGLang #8263", "the LoRA adapter left out of the "
              "prefix-cache key: a request through tenant B's adapter is served the KV computed under tenant A's for "
              "the same prompt, and answers as A's fine-tune", {"lora_missing_from_cache_key": True},
              "the adapters check's shared round: one fresh prompt through every tenant's adapter in turn",
              FindingKind.CROSS_TENANT_ECHO, checks=("adapters",), audit={"adapters": ADAPTERS}),
    EngineBug("vLLM #47724 (PR #47725)", "activating an adapter (a runtime `add_lora()`) evicted a LoRA slot that an "
              "in-flight request still decoded with: it finished with another tenant's adapter, with no error, log "
              "or metric", {"lora_slot_evicted_in_flight": True},
              "the adapters check's first round: every tenant's trigger through its own adapter, all at once",
              FindingKind.CROSS_TENANT_ECHO, checks=("adapters",), engine={"max_loras": 1},
              audit={"adapters": ADAPTERS}),
    EngineBug("vLLM #55547, #55439, PR #53471", "a client's media uuid the sole key of the processed-media cache: "
              "another tenant's image sent under that uuid, or the uuid alone, is answered with the first tenant's "
              "image", {"media_cache_trusts_uuid": True},
              "the media-cache check: the observer's own card under the victim's uuid, then the uuid alone",
              FindingKind.CROSS_TENANT_ECHO, checks=("media-cache",)),
    EngineBug("LMCache #3301, #4086", "image hashes cut to 16 bits: a different image whose hash agrees in those bits "
              "is answered with the first one's features", {"media_hash_truncated": True},
              "the media-cache check: a card of the observer's whose digest agrees with the victim's in 16 bits, "
              "found by search", FindingKind.CROSS_TENANT_ECHO, checks=("media-cache",)),
    EngineBug("Dynamo PR #8340", "an image hash that leaves the shape out: the same pixel bytes as 448 x 112 and as "
              "112 x 448 share one cache entry", {"media_hash_ignores_shape": True},
              "the media-cache check: the victim's pixel bytes with width and height swapped",
              FindingKind.CROSS_TENANT_ECHO, checks=("media-cache",)),
)
