"""The reference engine's prefix caches: which page-aligned prompt prefixes it has seen, what a new prompt finds
there, what its prefill must then compute, and which LoRA adapter computed a hit's KV.

The caches record hashes only (no pages are pinned): enough to report cached tokens and to skip the simulated
prefill cost of a hit.  A healthy engine publishes a page once its KV is written and computes a hit's pages anyway
(the stand-in for reading the cached KV, which holds the same).  Two faults make a hit read pages that nobody wrote
for this prompt: `cache_hit_reads_stale_pages` skips computing every hit, and `publishes_before_written` publishes
a prompt's pages when it is admitted, before any is written, so that a later hit on a page whose writer was aborted
first (its client hung up mid-prefill) skips computing that page and every hit after it (vLLM PR #56525: the retry
"hits the aborted request's deepest published-but-never-written boundary hash").  Positions not computed hold
whatever the pages the request was given held: another request's KV.

A request through a LoRA adapter is keyed as vLLM keys it, by the adapter and salt (an adapter serves one tenant),
and by salt alone where `lora_missing_from_cache_key` leaves the adapter out.  A prompt sent as embeddings is keyed
by its rows, page by page (as fixed vLLM hashes the embeds into each block, PR #56656), and by its placeholder ids
alone (zeros, one a token) where `prompt_embeds_missing_from_cache_key` leaves them out (vLLM #56655): two such
prompts of one length then share every page, and a hit is taken as cached without computing, so it reads what
the pages it was given hold: with pages reused in order, the previous prompt's.

With `storage_tier_entries` (or the fault `storage_tier_ignores_salt`) a second tier sits below the first, as SGLang's
HiCache or vLLM's CPU offload and KV connectors do: a written page the first tier evicts moves there, filed under the
key that tier gives it (tenant and salt as in the first; content alone with the fault), and a prompt's hits there
beyond the first tier's are reported apart (`Prefill.external`).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prober.input_embeds.codec import Rows
from prober.testbed.config import EngineConfig
from prober.testbed.tokenizer import TokenIds


@dataclass(frozen=True)
class Lookup:
    keys: list[bytes]  # one per whole page of the prompt, each chained on the ones before
    hits: int  # leading pages the cache holds
    unwritten: int | None  # the first of those that was published and never written (None: all were written)
    under: str | None = None  # the adapter whose request published the last page hit (None: the base model)
    lower: list[bytes] | None = None  # the keys the tier below files the same pages under (None: no tier below)


@dataclass
class _Page:
    written: bool  # its KV is in the pool
    under: str | None  # the adapter of the request that published it
    lower: bytes | None = None  # its key in the tier below, where it moves when evicted


class PrefixCache:
    """Page hashes keyed by tenant and cache salt; by salt alone where the fault shares it (vLLM's rule: equal
    salts, or none, share); by adapter and salt for a LoRA request; by content alone for the storage tier.  Each
    remembers whether its page was written, and under which adapter."""

    def __init__(self, page_size: int, capacity: int, shared: bool, *, content_only: bool = False,
                 adapter_blind: bool = False, below: PrefixCache | None = None) -> None:
        self.page_size = page_size
        self.capacity = capacity
        self.shared = shared
        self.content_only = content_only
        self.adapter_blind = adapter_blind
        self.below = below  # the tier its evicted written pages move to
        self._seen: OrderedDict[bytes, _Page] = OrderedDict()
        self._lock = threading.Lock()

    def _namespace(self, tenant: str, salt: str | None, adapter: str | None) -> bytes:
        if self.content_only:
            return b""
        salted = b"\0" + salt.encode() if salt is not None else b""
        if adapter is not None:
            return salted if self.adapter_blind else b"lora\0" + adapter.encode() + salted
        return salted if self.shared else tenant.encode() + salted

    def _chain(self, namespace: bytes, ids: TokenIds | Rows) -> list[bytes]:
        digest = hashlib.blake2b(namespace, digest_size=16)
        full = len(ids) // self.page_size
        keys = []
        for page in np.split(ids[: full * self.page_size], full) if full else []:
            digest.update(page.tobytes())
            keys.append(digest.copy().digest())
        return keys

    def admit(self, tenant: str, salt: str | None, ids: TokenIds | Rows, adapter: str | None, *, publish: bool,
              lower: list[bytes] | None = None) -> Lookup:
        """What the cache holds of the prompt; with `publish`, every page of it published now, unwritten.
        `lower`: the keys the tier below files the prompt's pages under."""
        keys = self._chain(self._namespace(tenant, salt, adapter), ids) if self.capacity else []
        with self._lock:
            hits = 0
            while hits < len(keys) and keys[hits] in self._seen:
                hits += 1
            unwritten = next((i for i in range(hits) if not self._seen[keys[i]].written), None)
            under = self._seen[keys[hits - 1]].under if hits else None
            for i, key in enumerate(keys if publish else keys[:hits]):
                self._seen.setdefault(key, _Page(False, adapter, lower[i] if lower else None))
                self._seen.move_to_end(key)
            self._evict()
        return Lookup(keys, hits, unwritten, under, lower)

    def written(self, keys: Sequence[bytes], adapter: str | None, lower: Sequence[bytes] = ()) -> None:
        """Pages whose KV is now in the pool: published (or marked) as written, under the adapter that wrote them
        where they were not published before; `lower`: their keys in the tier below."""
        if not self.capacity:
            return
        with self._lock:
            for i, key in enumerate(keys):
                page = self._seen.setdefault(key, _Page(True, adapter))
                page.written = True
                page.lower = page.lower or (lower[i] if i < len(lower) else None)
                self._seen.move_to_end(key)
            self._evict()

    def _evict(self) -> None:
        """The least recently used pages out; the written ones move to the tier below, where there is one (the
        locks are taken top down, never the other way)."""
        while len(self._seen) > self.capacity:
            _, page = self._seen.popitem(last=False)
            if self.below is not None and page.written and page.lower is not None:
                self.below.written([page.lower], page.under)


@dataclass(frozen=True)
class Prefill:
    """What one prompt's prefill does: the tokens reported cached (and not charged prefill time), the positions it
    takes as cached without computing them (`stale`, end exclusive), the lookups whose pages it publishes as it
    writes them, the adapter it writes them under, and the adapter whose KV its cached part holds."""

    cached: int
    stale: tuple[int, int]
    lookups: tuple[tuple[PrefixCache, Lookup], ...] = ()
    adapter: str | None = None
    under: str | None = None
    external: int | None = None  # of `cached`, the tokens the second tier served (None: the engine has none)

    def computed(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of positions [start, end) the prefill computes (all but the stale ones)."""
        low, high = self.stale
        parts = [(start, min(end, low)), (max(start, high), end)]
        return [(a, b) for a, b in parts if a < b]

    def written(self, end: int, page_size: int) -> None:
        """Positions below `end` are written: their whole pages, but the stale ones, published as written."""
        low, high = self.stale
        pages = [i for i in range(end // page_size) if (i + 1) * page_size <= low or i * page_size >= high]
        for cache, lookup in self.lookups:  # a cache that keeps nothing (no entries) looked up no keys
            kept = [i for i in pages if i < len(lookup.keys)]
            cache.written([lookup.keys[i] for i in kept], self.adapter,
                          [lookup.lower[i] for i in kept] if lookup.lower else ())


class Prefixes:
    """The engine's own prefix cache (the first tier) and, with `storage_tier_entries` or `storage_tier_ignores_salt`,
    a second tier below it holding what the first evicts: keyed like the first, or by content alone with the fault.
    Only the first tier is written directly; the second fills as the first evicts."""

    def __init__(self, config: EngineConfig) -> None:
        faults, entries, page = config.faults, config.prefix_cache_entries, config.page_size
        self.page_size = page
        self.faults = faults
        tiered = bool(config.storage_tier_entries) or faults.storage_tier_ignores_salt
        self.lower = PrefixCache(page, config.storage_tier_entries or entries, faults.shared_prefix_cache,
                                 content_only=faults.storage_tier_ignores_salt,
                                 adapter_blind=faults.lora_missing_from_cache_key) if tiered else None
        self.first = PrefixCache(page, min(entries, config.pool_tokens // page) if tiered else entries,
                                 faults.shared_prefix_cache, adapter_blind=faults.lora_missing_from_cache_key,
                                 below=self.lower)

    def admit(self, tenant: str, salt: str | None, ids: TokenIds, adapter: str | None = None,
              embeds: Rows | None = None) -> Prefill:
        """What the prompt finds cached (the second tier's hits counted beyond the first's), and what its prefill
        computes (`embeds`: its rows, where it came so)."""
        early = self.faults.publishes_before_written
        blind = embeds is not None and self.faults.prompt_embeds_missing_from_cache_key
        keyed = ids if embeds is None else np.zeros(len(ids), np.int32) if blind else embeds
        low = self.lower.admit(tenant, salt, keyed, adapter, publish=False) if self.lower else None
        top = self.first.admit(tenant, salt, keyed, adapter, publish=early, lower=low.keys if low else None)
        best = top if low is None or top.hits >= low.hits else low
        cached = min(best.hits * self.page_size, max(0, len(ids) - 1))  # never the whole prompt
        external = None if low is None else max(0, cached - top.hits * self.page_size)
        if self.faults.cache_hit_reads_stale_pages or blind:
            stale = (0, cached)  # computed by nobody
        elif early and best.unwritten is not None:
            stale = (min(best.unwritten * self.page_size, cached), cached)
        else:
            stale = (0, 0)
        return Prefill(cached, stale, ((self.first, top),), adapter, best.under, external)
