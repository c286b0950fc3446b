"""The reference engine's prefix cache: which page-aligned prompt prefixes were seen, under which key, and which
adapter computed them.

Keyed by tenant and cache salt; by salt alone where the fault shares it (vLLM's rule: equal salts, or none, share);
by content alone for the storage tier.  A request through a LoRA adapter is keyed as vLLM keys it, by the adapter
and salt (an adapter serves one tenant), and by salt alone where a fault leaves the adapter out.  It records hashes
only (no pages are pinned), enough to report cached_tokens, to skip the simulated prefill cost of a hit, and to say
under which adapter a hit's KV was computed.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from prober.testbed.tokenizer import TokenIds


@dataclass(frozen=True)
class CacheHit:
    tokens: int  # the cached prefix, in tokens (never the whole prompt)
    under: str | None = None  # the adapter whose request computed it (None: the base model)


MISS = CacheHit(0)


class PrefixCache:
    def __init__(self, page_size: int, capacity: int, shared: bool, *, content_only: bool = False,
                 adapter_blind: bool = False) -> None:
        self.page_size = page_size
        self.capacity = capacity
        self.shared = shared
        self.content_only = content_only
        self.adapter_blind = adapter_blind
        self._seen: OrderedDict[bytes, str | None] = OrderedDict()  # block key -> the adapter that computed it
        self._lock = threading.Lock()

    def _namespace(self, tenant: str, salt: str | None, adapter: str | None) -> bytes:
        if self.content_only:
            return b""
        salted = b"\0" + salt.encode() if salt is not None else b""
        if adapter is not None:
            return salted if self.adapter_blind else b"lora\0" + adapter.encode() + salted
        return salted if self.shared else tenant.encode() + salted

    def _chain(self, namespace: bytes, ids: TokenIds) -> list[bytes]:
        digest = hashlib.blake2b(namespace, digest_size=16)
        full = len(ids) // self.page_size
        keys = []
        for page in np.split(ids[: full * self.page_size], full) if full else []:
            digest.update(page.tobytes())
            keys.append(digest.copy().digest())
        return keys

    def lookup_and_insert(self, tenant: str, salt: str | None, ids: TokenIds, adapter: str | None = None) -> CacheHit:
        """The cached prefix, then remember this prompt (a block keeps the adapter that computed it first)."""
        if self.capacity == 0:
            return MISS
        keys = self._chain(self._namespace(tenant, salt, adapter), ids)
        with self._lock:
            hits = 0
            for key in keys:
                if key not in self._seen:
                    break
                hits += 1
            under = self._seen[keys[hits - 1]] if hits else None
            for key in keys:
                self._seen.setdefault(key, adapter)
                self._seen.move_to_end(key)
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)
        return CacheHit(min(hits * self.page_size, max(0, len(ids) - 1)), under)
