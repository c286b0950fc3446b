"""Value types shared by canaries, the ledger, detection and reporting."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum, StrEnum
from typing import TypedDict, TypeVar

from prober.domain.codec import JSON
from prober.domain.evidence import Evidence, Tagged, adding, find

T = TypeVar("T", bound=Tagged)


class CanaryKind(StrEnum):
    TOKEN = "token"  # high-entropy, HMAC-verifiable string
    FACT = "fact"  # natural-language sentence with distinctive slot values


class Severity(IntEnum):
    """Ordered, so `--fail-on` can compare."""

    INFO = 10
    WARNING = 20
    HIGH = 30
    CRITICAL = 40

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r}; choose one of "
                             f"{', '.join(s.label for s in cls)}") from None


class FindingKind(StrEnum):
    CROSS_TENANT_ECHO = "cross_tenant_echo"  # another tenant's canary in this answer
    FOREIGN_CONTENT = "foreign_content"  # answer material that the prompt cannot explain
    GARBLED_OUTPUT = "garbled_output"  # an answer no healthy model writes: the engine corrupted what it decoded
    BOUNDARY_ACCEPTED = "boundary_accepted"  # served a prompt a correct engine must refuse
    PLACEHOLDER_SUBSTITUTION = "placeholder_substitution"  # usage says far fewer tokens than were sent
    STREAM_ERROR = "stream_error"  # an error object inside an HTTP-200 stream, or a stream cut for not ending
    ODD_FINISH_REASON = "odd_finish_reason"  # served, but finished for a reason no client expects
    UNEXPECTED_REFUSAL = "unexpected_refusal"  # refused a prompt the capacity says fits
    ENGINE_ERROR = "engine_error"  # HTTP 5xx, or an answer cut for not ending: the engine failed to answer or refuse
    IMPLAUSIBLE_USAGE = "implausible_usage"  # usage figures no engine could report for this prompt
    CROSS_TENANT_CACHE_HIT = "cross_tenant_cache_hit"  # another tenant's prompt prefix was served from cache
    CROSS_TENANT_CACHE_TIMING = "cross_tenant_cache_timing"  # another tenant's prompts came back sooner (TTFT)
    CROSS_REQUEST_ECHO = "cross_request_echo"  # another concurrent request's canary (same tenant) in this answer
    PHANTOM_CACHE_HIT = "phantom_cache_hit"  # cached tokens claimed for a prompt no one had sent: KV never computed
    COUNTED_FAILURE = "counted_failure"  # the engine counted an abort or a failed transfer while this answer was 200
    PATH_JITTER = "path_jitter"  # served or refused at a length the path's varying prefix leaves undecided (info)
    CROSS_TENANT_RESPONSE_CACHE = "cross_tenant_response_cache"  # a cache in front served another tenant's answer
    TENANT_RESPONSE_CACHE = "tenant_response_cache"  # a cache in front serves a tenant its own earlier answers (info)
    ROUTE_DEPENDENT_CACHE = "route_dependent_cache"  # a cache in front keeps tenants apart on some routes, not all


class DetectorName(StrEnum):
    """What found a finding: a detector of answer text (prober/detect), or a check's own judgement."""

    EXACT = "exact"
    FUZZY = "fuzzy"
    FRAGMENT = "fragment"
    SEMANTIC = "semantic"
    VERBATIM = "verbatim"
    FOREIGN = "foreign"
    GARBLED = "garbled"
    ENVELOPE = "envelope"  # status, usage, finish reason and cached tokens against what a correct engine does
    ENGINE_COUNTERS = "engine_counters"  # the engine's failure counters against their background
    TIMING = "timing"  # time to first token


@dataclass(frozen=True, slots=True)  # slots: a daemon or a log scan may hold 100,000+ of them
class Canary:
    id: str
    tenant: str
    kind: CanaryKind
    text: str
    probe_id: str = ""
    created_at: float = 0.0
    expires_at: float = 0.0
    pack: str = ""  # fact pack (language) it was minted from
    values: tuple[str, ...] = ()  # a fact's distinctive values, which attribute a paraphrase
    aliases: tuple[tuple[int, str], ...] = ()  # (index into `values`, another spelling): how it reads in another script
    embedding: bytes | None = field(default=None, repr=False)  # float32, for facts
    embedding_model: str = ""


@dataclass(frozen=True)
class Record:
    """One answer to check: who received it, what it says, and (optionally) the prompt it answered."""

    id: str
    tenant: str
    text: str
    prompt: str | None = None


@dataclass(frozen=True)
class ProbeContext:
    """Where a run found it, when a run did (a log scan knows none of it): the request's prompt length in tokens,
    the boundary the request aimed at, the HTTP status its answer came with."""

    prompt_tokens: int | None = None
    boundary: str | None = None
    status: int | None = None

    def to_json(self) -> ContextDoc:
        return {"prompt_tokens": self.prompt_tokens, "boundary": self.boundary, "status": self.status}


class ContextDoc(TypedDict):
    prompt_tokens: int | None
    boundary: str | None
    status: int | None


class ExcerptDoc(TypedDict):
    excerpt: str
    excerpt_sha256: str
    offsets: list[int]  # [start, end) in the answer as it came
    redacted: bool


class FindingDoc(ContextDoc):
    """`Finding.to_json`: the one JSON form of a finding."""

    kind: str
    severity: str
    target: str | None
    check: str | None
    victim_tenant: str | None
    observer_tenant: str
    record_id: str
    canary_id: str | None
    canary_probe: str | None
    detector: str
    score: float
    found_at: float | None
    evidence: ExcerptDoc
    details: list[dict[str, JSON]]  # the typed evidence, each item with its `type` (prober/domain/evidence.py)


@dataclass(frozen=True)
class Finding:
    record_id: str
    kind: FindingKind
    detector: DetectorName
    severity: Severity
    score: float
    observer_tenant: str
    victim_tenant: str | None = None  # None for foreign content: whose it is is unknown
    target: str = ""  # the endpoint that answered (set by whoever knows it: the runner, a log scan)
    check: str = ""  # the check whose run found it (prober/checks registry's name); "" for a log scan
    found_at: float = 0.0  # when it was recorded (unix seconds)
    canary_id: str | None = None
    probe_id: str | None = None
    start: int = 0
    end: int = 0
    excerpt: str = ""
    excerpt_sha256: str = ""
    redacted: bool = False
    context: ProbeContext = ProbeContext()
    evidence: tuple[Evidence, ...] = ()  # the detector's and checks' evidence, one item of a type (domain/evidence.py)

    def evidence_of(self, kind: type[T]) -> T | None:
        return find(self.evidence, kind)

    def adding(self, *items: Evidence) -> Finding:
        """With more evidence, each item replacing the one of its type."""
        return replace(self, evidence=adding(self.evidence, *items))

    def describe(self) -> str:
        """One log line with what an on-call engineer needs first (no excerpt: it may hold tenant data)."""
        victim = f" victim={self.victim_tenant}" if self.victim_tenant else ""
        canary = f" canary={self.canary_id}" if self.canary_id else ""
        return (f"finding {self.severity.label} {self.kind.value} target={self.target or '?'} "
                f"observer={self.observer_tenant}{victim} probe={self.record_id} "
                f"prompt_tokens={self.context.prompt_tokens} detector={self.detector}{canary}")

    def to_json(self) -> FindingDoc:
        """The one JSON form of a finding, in every report and in `scan -f json`: what, between whom, in which
        answer (`record_id`: the request of an audit or daemon, the record of a scanned log), found by which check,
        at which prompt length and boundary where a run knows them, the masked excerpt and the typed evidence."""
        return {
            "kind": self.kind.value,
            "severity": self.severity.label,
            "target": self.target or None,
            "check": self.check or None,
            "victim_tenant": self.victim_tenant,
            "observer_tenant": self.observer_tenant,
            "record_id": self.record_id,
            "canary_id": self.canary_id,
            "canary_probe": self.probe_id if self.probe_id != self.record_id else None,  # where it was planted
            "detector": self.detector.value,
            "score": round(self.score, 4),
            **self.context.to_json(),
            "found_at": self.found_at or None,
            "evidence": {"excerpt": self.excerpt, "excerpt_sha256": self.excerpt_sha256,
                         "offsets": [self.start, self.end], "redacted": self.redacted},
            "details": [item.to_json() for item in self.evidence],
        }
