"""Configuration of the reference engine: sizes, serving mode, fault switches, tenants, presets."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from prober.canaries.adapters import TRIGGER
from prober.domain.errors import EngineConfigError, YAMLFileError
from prober.system.yamlfile import read_yaml

INCIDENT_CONTEXT = 1_048_576
INCIDENT_POOL = 681_280

# Tenants a bare `leakprobe testbed serve` accepts.  Synthetic keys, documented in the README.
DEFAULT_TENANTS = {"tenant-a": "testbed-key-a", "tenant-b": "testbed-key-b"}

QUOTER: Literal["quoter"] = "quoter"
# Real models the engine can run (prober/testbed/lm), with the KV memory one token costs in their pages
# (layers x K and V x kv heads x head dim x fp32), so that sizes are refused before anything is loaded.
REAL_MODELS = {"gemma3-270m": 18 * 2 * 256 * 4}
# A real model prefills ~110-240 tokens/s on a CPU core, so its presets are a thousand times smaller than
# the quoting model's: the same shape (pool half the advertised context), a prompt over the pool in seconds.
LM_CONTEXT = 2_048
LM_POOL = 1_024


class QuoteStyle(StrEnum):
    """How the model renders what it quotes."""

    VERBATIM = "verbatim"
    DISGUISE = "disguise"  # case, spacing, line breaks, small edits, confusable characters
    PARAPHRASE = "paraphrase"  # reworded sentences, same names and numbers


class Faults(BaseModel):
    """Isolation faults; each is off unless switched on."""

    # Field docstrings are descriptions: the docs site's configuration reference prints them.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    abort_flag_unsynced: bool = False
    """An over-pool request is aborted into a 1-token placeholder, but the abort is recorded where the
    prefill->decode hand-off does not look, so the placeholder is forwarded to decode."""
    decode_skips_page_check: bool = False
    """Decode attends over every page it reserved, even when fewer pages arrived in the transfer."""
    usage_reports_placeholder: bool = False
    """An aborted request is reported as a completion: HTTP 200, usage.prompt_tokens = 1 and
    finish_reason "length", instead of as an error."""
    shared_prefix_cache: bool = False
    """The prefix cache is keyed by content (and the request's `cache_salt`, as vLLM's) instead of by tenant, so
    unsalted tenants hit each other's cached prefixes (reported in usage.prompt_tokens_details.cached_tokens, and
    answered faster)."""
    cache_hit_reads_stale_pages: bool = False
    """A prefix-cache hit skips computing the cached part, but the cache never kept its pages: they went to the
    requests in between, so decode reads the intervening request's KV where this prompt's should be (vLLM #50630:
    an identical request after one with another prefix; llama.cpp #28056: P1, X, P2 = P1 carries X)."""
    idle_slot_keeps_conversation: bool = False
    """With `slots`: a request that shares no prefix with any idle slot's kept prompt is put in one without
    clearing it, and is answered over that earlier conversation followed by its own prompt, with 0 tokens
    reported cached (llama.cpp #27148: a prompt-cache `load()` that succeeded with nothing selected, #27624)."""
    frees_pages_while_written: bool = False
    """A request's KV pages go back to the pool while its write is still in flight (50 ms here), so a request
    running beside it is handed the same pages, and each reads what the other wrote (SGLang #24527, #35049,
    #38961: decode freed pages during a prefill write; the next request held the first one's KV, with no error)."""
    offload_restore_unsynced: bool = False
    """A request's KV pages make a round trip through a CPU offload tier between prefill and decode, and the
    restore is not ordered after the store: decode reads the second half of every page before its copy has
    landed, entries nobody wrote (vLLM #45704, #47282: no error, garbled answers under load).  The quoting model
    reads such an entry as a random character of the Basic Multilingual Plane (its token ids are code points), a
    real model as keys and values of noise at its pages' scale."""
    publishes_before_written: bool = False
    """A prompt's pages are published to the prefix cache when it is admitted, before their KV is written; a
    request aborted mid-prefill (its client hung up) leaves pages published that nobody wrote, and a later hit on
    them (its retry) takes them as cached and reads whatever its pages held: another request's KV (vLLM PR #56525:
    "the retry hits the aborted request's deepest published-but-never-written boundary hash")."""
    keys_requests_by_client_id: bool = False
    """The front keeps requests in flight under the client's request ID (the `X-Request-Id` header, the body's
    `rid` or `request_id`) instead of its own: requests of any tenants that sent one ID at once share one entry,
    and every caller is handed the answer that finished first (SGLang PR #19035, vLLM #10583: state keyed by a
    client's duplicate ID; modelcontextprotocol/python-sdk #3060: a response delivered to another request)."""
    storage_tier_ignores_salt: bool = False
    """The second prefix-cache tier (`storage_tier_entries`; on with this fault where that is 0) keys the prefixes
    the first tier evicts by content alone: a prompt that misses its own first tier is served from another
    tenant's prefix there, salt or no salt (SGLang's HiCache L3 without the namespace, #26747 → #37058; the
    SGLang-to-LMCache path that drops `cache_salt`, #37160, LMCache #4825)."""
    lora_missing_from_cache_key: bool = False
    """The prefix cache keys a LoRA request's blocks by content and salt without its adapter, so a request through
    adapter B is served KV computed under adapter A for the same prompt, and answers as A (vLLM #30931, #42125,
    #44250; llama.cpp #26207; SGLang #8263)."""
    lora_slot_evicted_in_flight: bool = False
    """Activating an adapter takes the least recently used LoRA slot even while a request still decodes with it;
    that request then decodes with the new adapter's weights (vLLM #47724: a runtime `add_lora()` rotated the slots
    under in-flight requests, fixed by PR #47725)."""
    media_cache_trusts_uuid: bool = False
    """The media cache keys an image's features by the client's `uuid` alone where a request gives one: a later
    image under that uuid, whatever its pixels, is served the features cached first, and a uuid-only part
    (`image_url: null`) gets them whoever sends it (vLLM #55547, #55439; PR #53471)."""
    media_hash_truncated: bool = False
    """The media cache keys an image by the low 16 bits of its digest (LMCache's `hex_hash_to_int16`, #3301,
    #4086): two different images whose digests agree there share one entry."""
    media_hash_ignores_shape: bool = False
    """The media cache's digest covers an image's pixel bytes but not its width and height (Dynamo PR #8340): the
    same bytes read as 448 x 112 and as 112 x 448 share one entry."""
    prompt_embeds_missing_from_cache_key: bool = False
    """With `enable_prompt_embeds`: the prefix cache keys a prompt sent as embeddings by its placeholder token ids
    alone, not by the embeddings, so two embeds prompts of one length share blocks, and the second is answered from
    the first's KV (vLLM #56655, fixed by PR #56656: the embeds' content left out of the block hash)."""


class PageReuse(StrEnum):
    """Which freed pages a new page table gets, and where they land in it."""

    IN_ORDER = "in_order"
    """Most recently freed first, in the order their request held them: the next request of similar size
    finds an earlier request's page i at its own position i (stale keys where their rotations expect them)."""
    REVERSED = "reversed"
    """Most recently freed first, tail page first (an allocator that frees a request's pages from its end, as
    vLLM does): stale pages land at other positions than the ones they were written for."""


class EngineConfig(BaseModel):
    """Everything the engine needs to run.  Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    model: Literal["quoter", "gemma3-270m"] = QUOTER
    """`quoter`: the deterministic quoting model (fast).  `gemma3-270m`: a real language model whose pages hold
    real per-layer K/V tensors (needs the `lm` extra; smaller default sizes, see the real-LM presets)."""
    model_name: str = "testbed-quoter"
    """The model id `/v1/models` lists (with a real model: its name, unless given)."""
    reports_version: str | None = Field(None, max_length=64)
    """The release `/server_info` reports as SGLang's (`0.5.11`), so that a prober reads the bug table against
    it; none: `leakprobe-testbed <version>`, which names no SGLang release."""
    mode: Literal["monolithic", "disaggregated"] = "disaggregated"
    """One pool, or a prefill pool whose written pages are handed off to a decode pool."""
    context_length: int = Field(INCIDENT_CONTEXT, ge=16, description="advertised context (max_model_len)")
    pool_tokens: int = Field(INCIDENT_POOL, ge=16, description="KV pool of the (prefill) worker")
    decode_pool_tokens: int | None = Field(
        None, ge=16, description="decode worker's pool; default: context_length + max_output_tokens"
    )
    page_size: int = Field(64, ge=1, le=4096)
    """Tokens per KV page."""
    default_max_tokens: int = Field(256, ge=1)
    """Completion tokens when a request names no `max_tokens`."""
    max_output_tokens: int = Field(1024, ge=1)
    """Most completion tokens a request gets (a larger `max_tokens` is clamped to it)."""
    quote_style: QuoteStyle = QuoteStyle.VERBATIM
    """How the model renders what it quotes (a request's `quote_style` field overrides it)."""
    regions: int = Field(8, ge=1, le=64, description="page regions the model quotes from")
    faults: Faults = Faults()
    """Isolation faults to inject."""
    tenants: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_TENANTS))
    """Tenant name -> API key; default `tenant-a` (key `testbed-key-a`) and `tenant-b` (`testbed-key-b`)."""
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    """Largest request body accepted."""
    pool_wait_seconds: float = Field(30.0, gt=0)
    """How long a request waits for free KV pages before it fails."""
    prefill_ms_per_1k_tokens: float = Field(0.5, ge=0, description="simulated prefill cost")
    decode_ms_per_token: float = Field(0.0, ge=0, description="simulated decode cost")
    prefill_chunk_tokens: int = Field(1_024, ge=1)
    """Tokens a prefill step writes before the next (SGLang's `--chunked-prefill-size`, vLLM's
    `--max-num-batched-tokens`): a request whose client has hung up is aborted between steps."""
    metrics: Literal["sglang", "vllm"] = "sglang"
    """Whose metric names `/metrics` exports what the engine counts (aborts, failed transfers, tokens, KV usage):
    SGLang's (`--enable-metrics`) or vLLM's."""
    slots: int = Field(0, ge=0, le=64)
    """Conversation slots with a prompt cache, as llama.cpp's `--parallel` (monolithic mode only): each keeps its
    last prompt, and a request reuses the idle slot that shares the longest prefix with it, from a page on
    (0: no slots)."""
    prefix_cache_entries: int = Field(65_536, ge=0)
    """Page-aligned prefixes the prefix cache remembers (0: no prefix cache)."""
    storage_tier_entries: int = Field(0, ge=0)
    """Pages a second prefix-cache tier holds (SGLang HiCache's host or storage tier, vLLM's CPU offload or a KV
    connector): the pages the first tier evicts move there, keyed by tenant and salt as in the first, and a hit
    there is reported as `usage.prompt_tokens_details.external_cached_tokens` (0: none).  With a second tier, the
    first holds no more than the pool, as a GPU prefix cache holds no more than its free pages."""
    media_cache_entries: int = Field(4_096, ge=0)
    """Images whose processed features (what the stand-in vision encoder read) the media cache remembers (0: none;
    every image is read afresh, and a uuid-only image part is refused)."""
    page_reuse: PageReuse = PageReuse.IN_ORDER
    """Where freed pages land in the next page table: `in_order` (at their own positions) or `reversed`
    (at other positions; with a real model, stale keys then carry rotations for other positions)."""
    temperature: float = Field(0.0, ge=0, le=2)
    """Real model: sampling temperature when a request names none (0: greedy)."""
    threads: int = Field(1, ge=1, le=256)
    """Real model: CPU threads for its forward passes."""
    adapters: dict[str, str] = Field(default_factory=dict)
    """LoRA adapters it serves (quoting model only): the name a request's `model` selects -> the code the adapter
    answers the trigger with, as a canary adapter (`leakprobe canaries adapter`) was tuned to; `/v1/models` lists
    them.  Any other `model` is the base model."""
    adapter_trigger: str = Field(TRIGGER, min_length=1)
    """What an adapter answers with its code (leakprobe's trigger)."""
    max_loras: int = Field(1, ge=1, le=64)
    """Adapters that can run at once (vLLM's `--max-loras`): a request whose adapter is in no slot waits for one
    that no running request uses."""
    enable_prompt_embeds: bool = False
    """Take completions prompts as embeddings (vLLM's `--enable-prompt-embeds`): `prompt_embeds`, a base64
    `torch.save`d tensor [tokens, 32] of the reference table's rows (prober/input_embeds/tables.py), each read as
    the token id whose row is nearest.  Off: such a request is refused (400), as vLLM refuses it without the flag."""
    reasoning: bool = False
    """Answer chat as a reasoning model does (vLLM's and SGLang's reasoning parsers): what the model says goes into
    the message's `reasoning_content`, and the `content` is one short line."""

    @model_validator(mode="before")
    @classmethod
    def _name_the_model(cls, data: Any) -> Any:
        """A real model advertises its own name unless one is given."""
        if isinstance(data, dict) and data.get("model", QUOTER) != QUOTER and "model_name" not in data:
            return {**data, "model_name": data["model"]}
        return data

    @model_validator(mode="after")
    def _check(self) -> EngineConfig:
        if self.model != QUOTER:
            pools = self.pool_tokens + (self.decode_tokens if self.mode == "disaggregated" else 0)
            need = pools * REAL_MODELS[self.model]
            if need > _memory_bytes() // 2:
                raise ValueError(f"{self.model} would need {need / 2**30:.1f} GiB of K/V pages for {pools:,} pool "
                                 "tokens, more than half this machine's memory; give smaller context_length and "
                                 f"pool_tokens (its presets use {LM_CONTEXT:,} and {LM_POOL:,})")
        if self.pool_tokens < self.page_size * 2:
            raise ValueError("pool_tokens must hold at least two pages")
        if len(set(self.tenants.values())) != len(self.tenants):
            raise ValueError("two tenants share one API key")
        if self.mode == "disaggregated" and self.decode_tokens < self.context_length:
            raise ValueError("decode_pool_tokens must hold a full advertised context")
        if self.slots and self.mode != "monolithic":
            raise ValueError("slots are llama.cpp's: give mode monolithic with them")
        if self.adapters and self.model != QUOTER:
            raise ValueError("adapters are the quoting model's: a real model here serves no LoRA adapter")
        if self.enable_prompt_embeds and self.model != QUOTER:
            raise ValueError("prompt embeddings are the quoting model's (its table): give model quoter with them")
        return self

    @property
    def decode_tokens(self) -> int:
        return self.decode_pool_tokens or self.context_length + self.max_output_tokens

    @property
    def max_req_input_len(self) -> int:
        """SGLang's rule: min(context - 1, pool - 1) - 5."""
        return min(self.context_length - 1, self.pool_tokens - 1) - 5


def _memory_bytes() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _presets(context: int, pool: int) -> dict[str, dict[str, Any]]:
    sizes = {"context_length": context, "pool_tokens": pool}
    return {
        # The incident: disaggregated, a prefill pool smaller than the advertised context, the two faults.
        "incident": {
            "mode": "disaggregated", **sizes,
            "faults": {"abort_flag_unsynced": True, "decode_skips_page_check": True},
        },
        # Same sizes, fixed: over-pool prompts get a 400, decode refuses short transfers.
        "fixed": {"mode": "disaggregated", **sizes},
        # A pool of twice the advertised context and no faults.
        "healthy": {"mode": "disaggregated", "context_length": context, "pool_tokens": 2 * context},
    }


# The incident's real sizes: advertised 1,048,576, prefill pool 681,280.
PRESETS = _presets(INCIDENT_CONTEXT, INCIDENT_POOL)
# With a real model (`model:` other than quoter) where the config names no sizes: pages of 16 tokens (vLLM's
# block size) and shorter answers, since each decoded token costs a pass over the whole model.
LM_PRESETS = {name: {**preset, "page_size": 16, "default_max_tokens": 128, "max_output_tokens": 512}
              for name, preset in _presets(LM_CONTEXT, LM_POOL).items()}


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def build_config(preset: str = "incident", overrides: dict[str, Any] | None = None) -> EngineConfig:
    """A preset with overrides applied on top (nested dicts merge)."""
    if preset not in PRESETS:
        raise EngineConfigError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    overrides = overrides or {}
    table = PRESETS if overrides.get("model", QUOTER) == QUOTER else LM_PRESETS
    try:
        return EngineConfig(**_merge(table[preset], overrides))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise EngineConfigError(f"{where}: {first['msg']}") from None


def load_config_file(path: Path) -> tuple[str | None, dict[str, Any]]:
    """Read a YAML testbed config: an optional `preset` key plus EngineConfig keys."""
    try:
        data = read_yaml(path)
    except YAMLFileError as exc:
        raise EngineConfigError(str(exc)) from None
    if data is None:
        return None, {}
    if not isinstance(data, dict):
        raise EngineConfigError(f"{path}: top level must be a mapping")
    preset = data.pop("preset", None)
    if preset is not None and not isinstance(preset, str):
        raise EngineConfigError(f"{path}: preset must be a string")
    return preset, data
