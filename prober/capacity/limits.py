"""What is known about a target's capacity, where each number came from, and what the numbers say."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TypedDict

from prober.capacity.version import EngineVersion, EngineVersionDoc
from prober.domain.types import Severity
from prober.targets.api import Engine

FIELDS = ("context_length", "pool_tokens", "max_req_input_len", "page_size", "slots", "accept_limit")


@dataclass(frozen=True)
class Known:
    value: int
    source: str  # e.g. "sglang /server_info max_total_num_tokens", "config", "bisection"

    def to_json(self) -> KnownDoc:
        return {"value": self.value, "source": self.source}


class KnownDoc(TypedDict):
    value: int
    source: str


@dataclass(frozen=True)
class EngineCache:
    """A cache the engine says it runs, or says is off (`prefix`: its prefix cache; `prefix-tier2`: a second tier
    below it, host memory or storage): what the cache checks test, known before they send anything.  Said, not
    seen: the cache map's word for the layer comes from the checks' requests and their same-tenant controls."""

    layer: str  # the cache map's layer name
    on: bool
    source: str  # e.g. "sglang /server_info disable_radix_cache"
    kind: str | None = None  # what the tier is, where the engine names it (e.g. a storage backend)

    def to_json(self) -> EngineCacheDoc:
        return {"layer": self.layer, "on": self.on, "source": self.source, "kind": self.kind}


class EngineCacheDoc(TypedDict):
    layer: str
    on: bool
    source: str
    kind: str | None


class CapacityDoc(TypedDict):
    engine: str | None
    version: EngineVersionDoc | None
    context_length: KnownDoc | None
    pool_tokens: KnownDoc | None
    max_req_input_len: KnownDoc | None
    page_size: KnownDoc | None
    slots: KnownDoc | None
    accept_limit: KnownDoc | None
    disaggregation_mode: str | None
    kv_unified: bool | None
    caches: list[EngineCacheDoc]
    notes: list[str]


@dataclass(frozen=True)
class Capacity:
    """`context_length` is what the API advertises per request; `pool_tokens` is the KV cache that must
    hold it; `accept_limit` is the longest prompt seen served (bisection)."""

    engine: Engine | None = None
    version: EngineVersion | None = None  # the engine's release, as it says it (what the bug table is read by)
    context_length: Known | None = None
    pool_tokens: Known | None = None
    max_req_input_len: Known | None = None
    page_size: Known | None = None
    slots: Known | None = None
    accept_limit: Known | None = None
    disaggregation_mode: str | None = None
    kv_unified: bool | None = None
    caches: tuple[EngineCache, ...] = ()  # the caches the engine says it runs (or has off)
    notes: tuple[str, ...] = ()

    def merged(self, other: Capacity) -> Capacity:
        """Fill what this one lacks from `other` (this one wins where both know)."""
        values = {name: getattr(self, name) or getattr(other, name) for name in FIELDS}
        return replace(self, **values, engine=self.engine or other.engine, version=self.version or other.version,
                       disaggregation_mode=self.disaggregation_mode or other.disaggregation_mode,
                       kv_unified=self.kv_unified if self.kv_unified is not None else other.kv_unified,
                       caches=self.caches or other.caches, notes=self.notes + other.notes)

    @property
    def advertised(self) -> Known | None:
        return self.context_length or self.accept_limit

    def to_json(self) -> CapacityDoc:
        def known(value: Known | None) -> KnownDoc | None:
            return value.to_json() if value else None

        return {"engine": str(self.engine) if self.engine else None,
                "version": self.version.to_json(self.engine) if self.version else None,
                "context_length": known(self.context_length),
                "pool_tokens": known(self.pool_tokens), "max_req_input_len": known(self.max_req_input_len),
                "page_size": known(self.page_size), "slots": known(self.slots),
                "accept_limit": known(self.accept_limit), "disaggregation_mode": self.disaggregation_mode,
                "kv_unified": self.kv_unified, "caches": [c.to_json() for c in self.caches],
                "notes": list(self.notes)}


class VerdictCode(StrEnum):
    """What a target's capacity numbers say, each at one severity."""

    CAPACITY_INVERSION = "capacity_inversion"  # the pool cannot hold one maximal request: the incident's mismatch
    THIN_MARGIN = "thin_margin"  # under twice the context: no room for a second maximal request
    SHARED_POOL_OVERSUBSCRIBED = "shared_pool_oversubscribed"  # slots that each advertise the context, one pool
    CAPACITY_UNKNOWN = "capacity_unknown"  # context or pool not exposed, nothing to compare
    OK = "ok"

    @property
    def severity(self) -> Severity:
        return _SEVERITIES.get(self, Severity.INFO)


_SEVERITIES = {VerdictCode.CAPACITY_INVERSION: Severity.CRITICAL, VerdictCode.THIN_MARGIN: Severity.WARNING,
               VerdictCode.SHARED_POOL_OVERSUBSCRIBED: Severity.WARNING}


@dataclass(frozen=True)
class Verdict:
    code: VerdictCode
    message: str
    advertised_context: int | None = None  # the numbers it compared, where it compared any
    pool_tokens: int | None = None
    slots: int | None = None

    @property
    def severity(self) -> Severity:
        return self.code.severity

    def to_json(self) -> CapacityVerdictDoc:
        doc: CapacityVerdictDoc = {"severity": self.severity.label, "code": self.code.value, "message": self.message}
        if self.advertised_context is not None:
            doc["advertised_context"] = self.advertised_context
        if self.pool_tokens is not None:
            doc["pool_tokens"] = self.pool_tokens
        if self.slots is not None:
            doc["slots"] = self.slots
        return doc


class _ComparedDoc(TypedDict, total=False):
    """The numbers a verdict compared, where it compared any (a base of its own: `NotRequired` is not seen at run
    time under postponed annotations, which the report's golden test reads)."""

    advertised_context: int
    pool_tokens: int
    slots: int


class CapacityVerdictDoc(_ComparedDoc):
    severity: str
    code: str
    message: str


def assess(capacity: Capacity) -> list[Verdict]:
    """Advertised context against KV pool.  A pool smaller than one maximal request is the incident's root
    mismatch (critical); under twice that leaves no room for a second maximal request (warning)."""
    ctx, pool = capacity.advertised, capacity.pool_tokens
    verdicts: list[Verdict] = []
    slots = capacity.slots.value if capacity.slots else 1
    if ctx is None or pool is None:
        missing = " and ".join(n for n, v in (("advertised context", ctx), ("KV pool size", pool)) if v is None)
        verdicts.append(Verdict(VerdictCode.CAPACITY_UNKNOWN,
                                f"{missing} not exposed; set them under `capacity:` in the config or allow "
                                "bisection (--bisect-budget) to compare them"))
        return verdicts

    def compared(code: VerdictCode, message: str, slots: int | None = None) -> Verdict:
        return Verdict(code, message, advertised_context=ctx.value, pool_tokens=pool.value, slots=slots)

    if pool.value < ctx.value:
        band = capacity.max_req_input_len.value if capacity.max_req_input_len else pool.value
        verdicts.append(compared(
            VerdictCode.CAPACITY_INVERSION,
            f"advertised context {ctx.value:,} tokens ({ctx.source}) exceeds the KV pool of {pool.value:,} "
            f"({pool.source}): prompts from about {band:,} to {ctx.value - 1:,} tokens pass the API's length "
            "check but cannot fit in the cache"))
    elif pool.value < 2 * ctx.value:
        verdicts.append(compared(
            VerdictCode.THIN_MARGIN,
            f"KV pool of {pool.value:,} tokens is under twice the advertised context of {ctx.value:,}: one "
            "maximal request leaves no room for a second (remediation margin: pool >= 2x context)"))
    if capacity.kv_unified and slots > 1 and slots * ctx.value > pool.value:
        verdicts.append(compared(
            VerdictCode.SHARED_POOL_OVERSUBSCRIBED,
            f"{slots} slots each advertise {ctx.value:,} tokens over one shared pool of {pool.value:,}: "
            "concurrent long prompts cannot all fit", slots))
    if not verdicts:
        verdicts.append(compared(VerdictCode.OK, f"KV pool {pool.value:,} >= 2x advertised context "
                                                     f"{ctx.value:,}"))
    return verdicts
