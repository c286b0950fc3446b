"""What a finding rests on, typed: each detector's and each check's evidence is one of the frozen dataclasses below
(the tagged union `Evidence`).  Each is written to JSON in one place (`Tagged.to_json`: its `type`, then its fields
by prober/domain/codec.py) and read back by the same code (`of_json`): the ledger keeps findings in that form and the
report renderers read it from the document.  A finding holds at most one item of a type.

What this version cannot read — a type a newer leakprobe wrote, a malformed body, a key of a ledger written before
evidence was typed that nothing here maps — is kept as written (`Unread`), never dropped and never a crash.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, TypeAlias, TypeVar

from prober.domain.codec import JSON, as_object, decode, encode

T = TypeVar("T", bound="Tagged")


class Tagged:
    """An evidence type: its tag in JSON, and its JSON written and read by the codec."""

    type: ClassVar[str]

    def to_json(self) -> dict[str, JSON]:
        return {"type": self.type, **as_object(encode(self), self.type)}


# -- what detectors saw -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MacVerified(Tagged):
    """A token whose MAC verifies under the deployment key, though this ledger never saw it (a replica's, one from
    before a restore): the tags it carries say whose it is."""

    type = "mac_verified"
    tenant_tag: str
    probe_tag: str


class FragmentKind(StrEnum):
    TOKEN_PART = "token_part"  # two or more groups of one token's body, where they belong
    PROBE_TAG = "probe_tag"  # a probe's tag, written as a token
    FACT_NAME = "fact_name"  # a person's full name of a fact
    FACT_WORD_NAME = "fact_word_name"  # a made-up one-word name of a fact (a place, a pet)


@dataclass(frozen=True)
class Fragment(Tagged):
    """Which piece of a canary survived: the groups of a token's body (0: the tag), or the probe tag written."""

    type = "fragment"
    kind: FragmentKind
    groups: tuple[int, ...] = ()
    tag: str | None = None


@dataclass(frozen=True)
class PromptRun(Tagged):
    """A run of another tenant's sent prompt, copied word for word."""

    type = "prompt_run"
    words: int


@dataclass(frozen=True)
class Unexplained(Tagged):
    """A sentence its prompt cannot explain: the share of its content words the prompt lacks, and identifiers new."""

    type = "foreign"
    unsupported_words: float
    new_identifiers: int


@dataclass(frozen=True)
class Garbled(Tagged):
    """Salad no healthy model writes: letters of clashing scripts glued together (how many clashes, which
    scripts), or characters no text holds (how many)."""

    type = "garbled"
    clashes: int = 0
    scripts: tuple[str, ...] = ()
    broken_characters: int = 0


@dataclass(frozen=True)
class Retold(Tagged):
    """A fact retold: how many of its distinctive values the answer holds (the score is the similarity)."""

    type = "semantic"
    slots_present: int
    slots_total: int


@dataclass(frozen=True)
class Escaped(Tagged):
    """The match was written in escapes (JSON, HTML, percent...), decoded before it was read."""

    type = "escaped"
    kinds: tuple[str, ...]


# -- what checks saw --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Envelope(Tagged):
    """What the answer's envelope said against what a correct engine does: the outcome due, why an answer was cut and
    how much of it had arrived, the prompt tokens usage claimed, the finish reason."""

    type = "envelope"
    expected: str | None = None
    cut: str | None = None
    arrived_chars: int | None = None
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class PathRange(Tagged):
    """Why the engine's verdict on a prompt at its limit proves nothing: the path in front adds a different number of
    tokens each time (`low` to `high` seen), so what the engine saw (`seen`, where its usage said) may lie on either
    side of `limit`, the shortest prompt a correct engine refuses."""

    type = "path_range"
    low: int
    high: int
    limit: int
    seen: int | None = None


@dataclass(frozen=True)
class SharedPrefix:
    """The longest prefix a prompt shares with one sender's earlier prompts, in the engine's tokens."""

    tokens: int
    tenant: str | None  # None: a sender this run cannot name
    sent_at: float | None  # None: no earlier prompt


@dataclass(frozen=True)
class CacheUsage(Tagged):
    """Cached tokens an answer reported, and what explains them: another tenant's prompt (`shared_with`, against the
    observer's own `own_shared`), or nothing sent before, past where the prompt is new (`fresh_from`)."""

    type = "cache_usage"
    cached_tokens: int
    shared_with: SharedPrefix | None = None
    own_shared: SharedPrefix | None = None
    fresh_from: int | None = None
    longest_shared: SharedPrefix | None = None


@dataclass(frozen=True)
class Change:
    """One engine series across a window: `delta` is after - before, or over several windows their deltas summed."""

    before: float
    after: float
    delta: float

    @classmethod
    def between(cls, before: float, after: float) -> Change:
        return cls(float(before), float(after), round(after - before, 6))


@dataclass(frozen=True)
class EngineCounters(Tagged):
    """What the engine's own metrics did while the request (or burst, or timing pair) ran, by series."""

    type = "engine_telemetry"
    changes: dict[str, Change]

    def then(self, later: EngineCounters) -> EngineCounters:
        """This window and a later one as one: the first before, the last after, the deltas summed (other requests
        may have run between them)."""
        changes = dict(self.changes)
        for name, change in later.changes.items():
            was = changes.get(name)
            changes[name] = change if was is None else Change(was.before, change.after, round(was.delta + change.delta,
                                                                                              6))
        return EngineCounters(changes)

    def moved(self) -> dict[str, float]:
        """The series that moved, by how much."""
        return {name: change.delta for name, change in self.changes.items() if change.delta}


@dataclass(frozen=True)
class CounterDecision:
    """One failure counter's rise in leakprobe's own windows, tested against its background rate."""

    counter: str
    own_events: float
    own_seconds: float
    background_events: float
    background_seconds: float
    p_value: float
    alpha: float  # the per-counter level: the false-alarm rate over the counters tested

    @property
    def found(self) -> bool:
        return self.p_value <= self.alpha


@dataclass(frozen=True)
class RisenWindow:
    """One of leakprobe's windows in which a failure counter rose beyond the window's own refusals."""

    request: str
    seconds: float
    excess: dict[str, float]


@dataclass(frozen=True)
class CounterTest(Tagged):
    """The engine's failure counters against their background: the test, its decisions, the windows that rose."""

    type = "counters"
    test: str
    decisions: tuple[CounterDecision, ...]
    windows: tuple[RisenWindow, ...]


@dataclass(frozen=True)
class TimingStatistics(Tagged):
    """One tenant pair's time-to-first-token test: would-be hits against fresh prompts, as the observer saw them."""

    type = "timing"
    test: str
    method: str  # exact | asymptotic, and how many rounds were combined
    p_value: float
    adjusted_p: float  # Holm over the run's pairs
    false_alarm: float
    rounds: int
    most_rounds: int
    u: float
    hit_faster_probability: float
    median_ttft_hit_s: float | None
    median_ttft_miss_s: float | None
    median_ratio: float | None
    median_ttft_victim_warm_s: float | None
    hits: int
    misses: int
    lost: int
    requests: int
    tokens: int
    mean_prompt_tokens: float | None  # of the observer's answers (a request's own length is the finding's context)


@dataclass(frozen=True)
class Burst(Tagged):
    """A cross-talk burst's request: whether it streamed, its own canary, and the request whose canary it carried
    (another of the same tenant's)."""

    type = "crosstalk"
    streamed: bool
    own_canary: str
    other_request: str | None = None


@dataclass(frozen=True)
class AdapterAsk(Tagged):
    """The adapters check's request: its round (`own`: every tenant's trigger at once; `shared`: one prompt through
    every adapter in turn), the adapter it asked through (None: the base model), whether it streamed, and whose
    adapter a shared prompt was sent through first."""

    type = "adapter"
    round: str
    adapter: str | None
    streamed: bool
    sent_first_through: str | None = None


@dataclass(frozen=True)
class SaltAsserted(Tagged):
    """The config says these tenants' prefix cache is salted, yet it was shared: the salt does not isolate."""

    type = "salt_asserted"
    tenants: tuple[str, ...]


@dataclass(frozen=True)
class Exchange(Tagged):
    """The exchange (prime and probe) whose answer it was found in."""

    type = "exchange"
    id: str


@dataclass(frozen=True)
class Traced(Tagged):
    """The W3C trace context the answer's request carried: where the engine exports traces (vLLM, SGLang), its span
    for that request is in trace `trace_id`."""

    type = "trace"
    trace_id: str
    span_id: str

    @classmethod
    def of(cls, traceparent: str | None) -> Traced | None:
        parts = (traceparent or "").split("-")
        return cls(parts[1], parts[2]) if len(parts) == 4 else None


class CacheLayer(StrEnum):
    """A cache in front of the engine that can answer in its place."""

    RESPONSE = "response"  # answers a request the same as a stored one with the stored answer
    SEMANTIC = "semantic"  # answers a request that reads alike (an embedding's distance) with the stored answer


@dataclass(frozen=True)
class FromCache(Tagged):
    """The answer was served from a cache in front of the engine, not made for its request: how that was told
    (`told`: a gateway's header, or an earlier answer repeated whole), and, where this process got the stored answer
    first, for whom (`first_tenant`) and in answer to which request (`first_trace`: its trace id, as on findings)."""

    type = "from_cache"
    layer: CacheLayer
    told: str
    answer_id: str | None = None
    first_tenant: str | None = None
    first_trace: str | None = None


@dataclass(frozen=True)
class Unread(Tagged):
    """Evidence this version cannot read, kept as it was written (JSON text)."""

    type = "unread"
    written: str

    @classmethod
    def of(cls, data: object) -> Unread:
        return cls(json.dumps(data, sort_keys=True, ensure_ascii=False))


Evidence: TypeAlias = Tagged  # any of the types above, or one a check brings (`register`)
TYPES: dict[str, type[Tagged]] = {cls.type: cls for cls in (
    MacVerified, Fragment, PromptRun, Unexplained, Garbled, Retold, Escaped, Envelope, PathRange, CacheUsage,
    EngineCounters, CounterTest, TimingStatistics, Burst, AdapterAsk, SaltAsserted, Exchange, Traced, FromCache,
    Unread)}


def register(kind: type[Tagged]) -> None:
    """An evidence type a check brings in its own module (prober/checks `Check.evidence`): written and read back like
    the types above.  A tag is one type's, whichever registers it."""
    known = TYPES.setdefault(kind.type, kind)
    if known is not kind:
        raise ValueError(f"evidence type {kind.type!r} is {known.__qualname__}'s already")


def of_json(data: JSON) -> Evidence:
    """An item from its JSON, or as `Unread` where this version cannot read it."""
    if isinstance(data, dict) and isinstance(data.get("type"), str):
        kind = TYPES.get(str(data["type"]))
        if kind is not None:
            try:
                return decode(kind, {k: v for k, v in data.items() if k != "type"})
            except ValueError:
                pass
    return Unread.of(data)


def find(items: Iterable[Evidence], kind: type[T]) -> T | None:
    """The item of a type, where there is one."""
    return next((item for item in items if isinstance(item, kind)), None)


def adding(items: tuple[Evidence, ...], *more: Evidence) -> tuple[Evidence, ...]:
    """`items` with `more` added, each replacing the item of its type (a finding holds one of each)."""
    kinds = {type(item) for item in more}
    return (*(item for item in items if type(item) not in kinds), *more)
