"""Where an answer came from: made by the engine for its request, or served from a cache in front of it.

A response or semantic cache in a gateway answers with a stored copy: the engine never saw the request, so the copy
says nothing about the engine (no boundary, envelope, counter, timing or cached-token judgement may be drawn from
it), and where the copy was made for another tenant, that tenant's answer reached this one.  Two things tell it:

- the gateway says so in a header (LiteLLM sends `x-litellm-cache-key` on a hit only, and
  `x-litellm-semantic-similarity` on a semantic hit; Cloudflare AI Gateway, Helicone, Portkey and HTTP caches their
  own cache-status headers);
- the answer repeats an earlier one whole: the same `id`, `created` and text (an answer without `created` is not
  compared).  An engine names each answer afresh, so a repeat is a stored object handed out again, and the book says
  for whom it was made.  Not an answer named by the ID the
  client gave its request (the request-ID check sends one ID for many requests, and engines name answers by it).

A cache that rebuilds each copy with a fresh `id` and `created`, and says nothing, is told by the response-cache check
instead: by the engine's own counters, where it reads them around its requests (no prompt counted), and by its
sampled requests (a repeat saying byte for byte what a sample said, which its log-probabilities make all but
impossible for a fresh decode).

A deterministic engine that gives the same text to the same prompt is not a cache: its answers differ in `id`.  A copy
handed out for a question other than the one it was made for came from a semantic cache (one that matches requests
that read alike).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from prober.domain.evidence import CacheLayer, FromCache, Traced
from prober.targets.result import Completion

# header -> (the layer a hit is on, the value's first words that mean a hit; empty: the header alone means one)
HIT_HEADERS: dict[str, tuple[CacheLayer, tuple[str, ...]]] = {
    "x-litellm-semantic-similarity": (CacheLayer.SEMANTIC, ()),
    "x-litellm-cache-key": (CacheLayer.RESPONSE, ()),
    "x-portkey-cache-status": (CacheLayer.RESPONSE, ("hit", "semantic hit")),
    "cf-aig-cache-status": (CacheLayer.RESPONSE, ("hit",)),
    "helicone-cache": (CacheLayer.RESPONSE, ("hit",)),
    "x-cache": (CacheLayer.RESPONSE, ("hit", "tcp_hit")),
    "x-cache-status": (CacheLayer.RESPONSE, ("hit",)),
}
KEPT = 8_192  # answers remembered per target: far more than a run sends between a prime and its probe


def hit_header(headers: dict[str, str]) -> tuple[str, CacheLayer] | None:
    """The header in which the path says it answered from a cache, and the layer it names."""
    for name, (layer, hits) in HIT_HEADERS.items():
        value = headers.get(name)
        if value is None:
            continue
        said = value.strip().lower()
        if not hits or said.startswith(hits):
            return name, (CacheLayer.SEMANTIC if "semantic" in said else layer)
    return None


@dataclass(frozen=True)
class Made:
    tenant: str
    trace_id: str | None  # the request it was made for, as the engine's traces know it
    request: str  # what was asked (a digest): a copy handed out for another question came from a semantic cache


class AnswerBook:
    """One per target: the answers it made, by what names them, so that one handed out again is known."""

    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._made: OrderedDict[tuple[str, int | None, str], Made] = OrderedDict()

    def read(self, tenant: str, answer: Completion, request: object, *, client_id: str | None = None
             ) -> FromCache | None:
        """Whether `tenant`'s answer to `request` (what was asked: its text and turns) was served from a cache, and
        how that was told (None: made for it).  `client_id`: the ID the client named the request by, where it did:
        an answer named by it was made for this request (or is the engine's own mix-up, the request-ID check's)."""
        if not answer.served:
            return None
        said = hit_header(answer.headers)
        asked = hashlib.sha256(repr(request).encode()).hexdigest()
        first = None
        named_by_client = client_id is not None and client_id in (answer.answer_id or "")
        if answer.answer_id and answer.created is not None:
            key = (answer.answer_id, answer.created, hashlib.sha256(answer.full_text.encode()).hexdigest())
            first = None if named_by_client else self._made.get(key)
            if key not in self._made:
                trace = Traced.of(answer.traceparent)
                self._made[key] = Made(tenant, trace.trace_id if trace else None, asked)
                while len(self._made) > self._kept:
                    self._made.popitem(last=False)
        if said is None and first is None:
            return None
        told = " and ".join(([f"header {said[0]}"] if said else [])
                            + (["an earlier answer repeated (id, created, text)"] if first else []))
        layer = said[1] if said else CacheLayer.RESPONSE
        if first is not None and first.request != asked:
            layer = CacheLayer.SEMANTIC  # the stored answer was made for another question
        return FromCache(layer, told, answer.answer_id, first.tenant if first else None,
                         first.trace_id if first else None)
