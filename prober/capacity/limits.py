"""What is known about a target's capacity, where each number came from, and what the numbers say."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from prober.targets.api import Engine
from prober.types import Severity

FIELDS = ("context_length", "pool_tokens", "max_req_input_len", "page_size", "slots", "accept_limit")


@dataclass(frozen=True)
class Known:
    value: int
    source: str  # e.g. "sglang /server_info max_total_num_tokens", "config", "bisection"

    def to_json(self) -> dict[str, object]:
        return {"value": self.value, "source": self.source}


@dataclass(frozen=True)
class Capacity:
    """`context_length` is what the API advertises per request; `pool_tokens` is the KV cache that must
    hold it; `accept_limit` is the longest prompt seen served (bisection)."""

    engine: Engine | None = None
    context_length: Known | None = None
    pool_tokens: Known | None = None
    max_req_input_len: Known | None = None
    page_size: Known | None = None
    slots: Known | None = None
    accept_limit: Known | None = None
    disaggregation_mode: str | None = None
    kv_unified: bool | None = None
    notes: tuple[str, ...] = ()

    def merged(self, other: Capacity) -> Capacity:
        """Fill what this one lacks from `other` (this one wins where both know)."""
        values = {name: getattr(self, name) or getattr(other, name) for name in FIELDS}
        return replace(self, **values, engine=self.engine or other.engine,
                       disaggregation_mode=self.disaggregation_mode or other.disaggregation_mode,
                       kv_unified=self.kv_unified if self.kv_unified is not None else other.kv_unified,
                       notes=self.notes + other.notes)

    @property
    def advertised(self) -> Known | None:
        return self.context_length or self.accept_limit

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"engine": self.engine}
        for name in FIELDS:
            known = getattr(self, name)
            out[name] = known.to_json() if known else None
        out["disaggregation_mode"] = self.disaggregation_mode
        out["kv_unified"] = self.kv_unified
        out["notes"] = list(self.notes)
        return out


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
    details: dict[str, object] = field(default_factory=dict)

    @property
    def severity(self) -> Severity:
        return self.code.severity

    def to_json(self) -> dict[str, object]:
        return {"severity": self.severity.label, "code": self.code, "message": self.message, **self.details}


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
    details: dict[str, object] = {"advertised_context": ctx.value, "pool_tokens": pool.value}
    if pool.value < ctx.value:
        band = capacity.max_req_input_len.value if capacity.max_req_input_len else pool.value
        verdicts.append(Verdict(
            VerdictCode.CAPACITY_INVERSION,
            f"advertised context {ctx.value:,} tokens ({ctx.source}) exceeds the KV pool of {pool.value:,} "
            f"({pool.source}): prompts from about {band:,} to {ctx.value - 1:,} tokens pass the API's length "
            "check but cannot fit in the cache", details))
    elif pool.value < 2 * ctx.value:
        verdicts.append(Verdict(
            VerdictCode.THIN_MARGIN,
            f"KV pool of {pool.value:,} tokens is under twice the advertised context of {ctx.value:,}: one "
            "maximal request leaves no room for a second (remediation margin: pool >= 2x context)", details))
    if capacity.kv_unified and slots > 1 and slots * ctx.value > pool.value:
        verdicts.append(Verdict(
            VerdictCode.SHARED_POOL_OVERSUBSCRIBED,
            f"{slots} slots each advertise {ctx.value:,} tokens over one shared pool of {pool.value:,}: "
            "concurrent long prompts cannot all fit", {**details, "slots": slots}))
    if not verdicts:
        verdicts.append(Verdict(VerdictCode.OK, f"KV pool {pool.value:,} >= 2x advertised context "
                                                     f"{ctx.value:,}", details))
    return verdicts
