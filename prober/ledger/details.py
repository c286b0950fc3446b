"""The findings table's `details` column: a finding's probe context, its check and its typed evidence as one JSON
object, with the version of its form.

Version 2 keeps the evidence as `domain/evidence.py` writes it (`"evidence": [{"type": ...}, ...]`).  Rows without a
version were written before evidence was typed: one flat object into which every stage put its keys.  They read into
the same types, key by key; what no type takes is kept as written (`Unread`), so an old finding loses nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from prober.domain.codec import JSON, decode
from prober.domain.evidence import (
    Burst,
    CacheUsage,
    CounterTest,
    EngineCounters,
    Envelope,
    Escaped,
    Evidence,
    Exchange,
    Fragment,
    Garbled,
    MacVerified,
    PromptRun,
    Retold,
    SaltAsserted,
    TimingStatistics,
    Unexplained,
    Unread,
    of_json,
)
from prober.domain.types import Finding, ProbeContext

VERSION = 2
# Version 1: the old keys of each type, as its fields (a key of the same name unless said); keys that said nothing
# the row does not hold elsewhere are dropped: `verified_by` ("mac"), `probe_id` (the row's own column).
_OLD: list[tuple[Callable[..., Evidence], dict[str, str]]] = [
    (MacVerified, {"tenant_tag": "tenant_tag", "probe_tag": "probe_tag"}),
    (Fragment, {"fragment": "kind", "groups": "groups", "tag": "tag"}),
    (Unexplained, {"unsupported_words": "unsupported_words", "new_identifiers": "new_identifiers"}),
    (Garbled, {name: name for name in ("clashes", "scripts", "broken_characters")}),
    (Retold, {"slots_present": "slots_present", "slots_total": "slots_total"}),
    (Escaped, {"escaped": "kinds"}),
    (Envelope, {name: name for name in ("expected", "cut", "arrived_chars", "usage_prompt_tokens", "finish_reason")}),
    (CacheUsage, {name: name for name in ("cached_tokens", "shared_with", "own_shared", "fresh_from",
                                          "longest_shared")}),
    (Burst, {"streamed": "streamed", "own_canary": "own_canary", "other_request": "other_request"}),
    (SaltAsserted, {"salt_asserted": "tenants"}),
    (Exchange, {"exchange": "id"}),
    (EngineCounters, {"engine_telemetry": "changes"}),
]
_DROPPED = ("verified_by", "probe_id")


def written(finding: Finding) -> str:
    context = {k: v for k, v in finding.context.to_json().items() if v is not None}
    return json.dumps({"version": VERSION, **context, **({"check": finding.check} if finding.check else {}),
                       "evidence": [item.to_json() for item in finding.evidence]})


def read(text: str) -> tuple[ProbeContext, str, tuple[Evidence, ...]]:
    """The context, the check and the evidence of a stored finding, in whichever version it was written."""
    stored = json.loads(text)
    details: dict[str, JSON] = stored if isinstance(stored, dict) else {"details": stored}
    context = _context_of(details)
    check = details.pop("check", "")
    if not isinstance(check, str):
        details["check"], check = check, ""
    if "version" not in details:
        return context, check, _version_1(details)
    evidence = details.get("evidence")
    return context, check, tuple(of_json(item) for item in evidence) if isinstance(evidence, list) else ()


def _context_of(details: dict[str, JSON]) -> ProbeContext:
    """The context taken out of the stored details (left there where a value is not of its type: the mean prompt
    length, a float, that timing findings kept under this name before it was `mean_prompt_tokens`)."""
    tokens, boundary, status = details.get("prompt_tokens"), details.get("boundary"), details.get("status")
    return ProbeContext(prompt_tokens=_pop_int(details, "prompt_tokens") if _is_int(tokens) else None,
                        boundary=str(details.pop("boundary")) if isinstance(boundary, str) else None,
                        status=_pop_int(details, "status") if _is_int(status) else None)


def _version_1(details: dict[str, JSON]) -> tuple[Evidence, ...]:
    """The flat object of a row written before evidence was typed, key by key into the types that hold them."""
    rest = {k: v for k, v in details.items() if k not in _DROPPED}
    found: list[Evidence] = []
    if rest.get("fragment") == "prompt_run":  # a verbatim run said it was a fragment
        del rest["fragment"]
        found += _take(rest, PromptRun, {"words": "words"})
    if "decisions" in rest:  # the counters' test, else a timing test, both under "test"
        found += _take(rest, CounterTest, {"test": "test", "decisions": "decisions", "windows": "windows"})
    elif "p_value" in rest:
        found += _take(rest, TimingStatistics, {name: name for name in TimingStatistics.__dataclass_fields__})
    for kind, names in _OLD:
        found += _take(rest, kind, names)
    return (*found, Unread.of(rest)) if rest else tuple(found)


def _take(rest: dict[str, JSON], kind: Callable[..., Evidence], names: Mapping[str, str]) -> list[Evidence]:
    """The item of `kind` from the keys of `rest` it had (taken out of `rest`), or nothing (they stay, unread)."""
    held = {old: rest[old] for old in names if old in rest}
    if not held:
        return []
    try:
        item = decode(kind, {names[old]: value for old, value in held.items()})
    except ValueError:
        return []
    for old in held:
        del rest[old]
    return [item]


def _pop_int(details: dict[str, JSON], key: str) -> int:
    value = details.pop(key)
    assert isinstance(value, int)
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
