"""A finding's evidence as typed items: each written to JSON once and read back exactly; what a version cannot read
kept as written; and the ledger's rows in both forms — the versioned one, and the free-form object every stage put
its keys into before evidence was typed (the shapes below are what that code wrote, from a real audit's report
where one had them)."""

from __future__ import annotations

import json

import pytest

from prober.domain.codec import JSON
from prober.domain.evidence import (
    TYPES,
    AdapterAsk,
    Burst,
    CacheLayer,
    CacheUsage,
    Change,
    CounterDecision,
    CounterTest,
    EngineCounters,
    Envelope,
    Escaped,
    Evidence,
    Exchange,
    Fragment,
    FragmentKind,
    FromCache,
    Garbled,
    MacVerified,
    PathRange,
    PromptRun,
    Retold,
    RisenWindow,
    SaltAsserted,
    SharedPrefix,
    TimingStatistics,
    Traced,
    Unexplained,
    Unread,
    adding,
    of_json,
)
from prober.domain.types import DetectorName, Finding, FindingKind, ProbeContext, Severity
from prober.ledger import details

pytestmark = pytest.mark.unit

ABORTS = "sglang:num_aborted_requests_total"
COUNTERS = EngineCounters({ABORTS: Change(0.0, 1.0, 1.0), "sglang:token_usage": Change(0.0, 0.0, 0.0)})
TIMING = TimingStatistics(
    test="one-sided Mann-Whitney U", method="exact", p_value=1.08e-05, adjusted_p=2.16e-05, false_alarm=0.001,
    rounds=1, most_rounds=3, u=0.0, hit_faster_probability=1.0, median_ttft_hit_s=0.012, median_ttft_miss_s=0.2,
    median_ratio=0.06, median_ttft_victim_warm_s=0.21, hits=10, misses=10, lost=0, requests=30, tokens=7680,
    mean_prompt_tokens=256.0)
DECISION = CounterDecision(ABORTS, 16.0, 0.214, 0.0, 10.825, 3.91128470666277e-28, 0.0002)
EVERY: list[Evidence] = [
    MacVerified("ga432", "epr"), Fragment(FragmentKind.TOKEN_PART, groups=(1, 2, 3)),
    PromptRun(19), Unexplained(0.875, 2), Garbled(3, ("Arabic", "Cyrillic", "Latin")), Retold(3, 4),
    Escaped(("html", "json")),
    Envelope(cut="deadline", arrived_chars=512), PathRange(1_796, 1_803, 4_090, seen=4_088),
    CacheUsage(256, shared_with=SharedPrefix(264, "a", 1.7e9), own_shared=SharedPrefix(0, "b", None)),
    COUNTERS, CounterTest("binomial", (DECISION,), (RisenWindow("x003-probe", 0.01, {ABORTS: 1.0}),)),
    TIMING, Burst(True, "cn_2", other_request="ct003"), AdapterAsk("shared", "adapter-b", True, "tenant-a"),
    SaltAsserted(("a", "b")), Exchange("x003"), Traced("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"),
    FromCache(CacheLayer.RESPONSE, "header x-litellm-cache-key", "chatcmpl-1", "tenant-a", "4bf92f35"),
    Unread('{"someday": 1}')]


def test_every_type_is_written_once_with_its_tag_and_read_back_exactly() -> None:
    assert {item.type for item in EVERY} == set(TYPES)
    for item in EVERY:
        written = json.loads(json.dumps(item.to_json()))
        assert written["type"] == item.type and of_json(written) == item, item


@pytest.mark.parametrize("data", [
    {"type": "tomorrow", "what": 1},  # a type a newer leakprobe writes
    {"type": "fragment", "kind": "half_a_name"},  # a value no kind has
    {"type": "prompt_run", "words": "many"},  # a value of the wrong type
    {"type": "exchange"},  # a field missing
    {"type": "exchange", "id": "x1", "more": True},  # a field this version does not know
    ["not", "an", "object"],
])
def test_what_this_version_cannot_read_is_kept_as_written(data: JSON) -> None:
    kept = of_json(data)
    assert isinstance(kept, Unread) and json.loads(kept.written) == data
    assert of_json(json.loads(json.dumps(kept.to_json()))) == kept


def test_a_finding_holds_one_item_of_a_type() -> None:
    items = adding((Exchange("x1"), COUNTERS), Exchange("x2"), SaltAsserted(("a",)))
    assert items == (COUNTERS, Exchange("x2"), SaltAsserted(("a",)))


OLD_TELEMETRY: dict[str, JSON] = {ABORTS: {"before": 0.0, "after": 1.0, "delta": 1.0},
                                  "sglang:token_usage": {"before": 0.0, "after": 0.0, "delta": 0.0}}
OLD_TIMING: dict[str, JSON] = {
    "test": "one-sided Mann-Whitney U", "method": "exact", "p_value": 1.08e-05, "adjusted_p": 2.16e-05,
    "false_alarm": 0.001, "rounds": 1, "most_rounds": 3, "u": 0.0, "hit_faster_probability": 1.0,
    "median_ttft_hit_s": 0.012, "median_ttft_miss_s": 0.2, "median_ratio": 0.06, "median_ttft_victim_warm_s": 0.21,
    "hits": 10, "misses": 10, "lost": 0, "requests": 30, "tokens": 7680, "mean_prompt_tokens": 256.0,
    "engine_telemetry": OLD_TELEMETRY, "salt_asserted": ["a"]}
# (the details column as written before evidence was typed, and what it reads as: context, check, evidence)
OLD_ROWS: list[tuple[dict[str, JSON], ProbeContext, str, list[Evidence]]] = [
    ({"expected": "refused", "engine_telemetry": OLD_TELEMETRY, "prompt_tokens": 4090, "boundary": "max_req_input_len",
      "status": 200},
     ProbeContext(4090, "max_req_input_len", 200), "", [Envelope(expected="refused"), COUNTERS]),
    ({"fragment": "token_part", "groups": [1, 2, 3], "exchange": "x004", "engine_telemetry": OLD_TELEMETRY,
      "prompt_tokens": 4097, "boundary": "pool+1", "status": 200},
     ProbeContext(4097, "pool+1", 200), "",
     [Fragment(FragmentKind.TOKEN_PART, groups=(1, 2, 3)), Exchange("x004"), COUNTERS]),
    ({"fragment": "probe_tag", "tag": "GA432EPR", "probe_id": "p-a1", "exchange": "x004", "escaped": ["json"]},
     ProbeContext(), "", [Fragment(FragmentKind.PROBE_TAG, tag="GA432EPR"), Escaped(("json",)), Exchange("x004")]),
    ({"fragment": "prompt_run", "words": 19, "probe_id": "p-a"}, ProbeContext(), "", [PromptRun(19)]),
    ({"verified_by": "mac", "tenant_tag": "ga432", "probe_tag": "epr"}, ProbeContext(), "",
     [MacVerified("ga432", "epr")]),
    ({"unsupported_words": 1.0, "new_identifiers": 1, "exchange": "x004"}, ProbeContext(), "",
     [Unexplained(1.0, 1), Exchange("x004")]),
    ({"slots_present": 3, "slots_total": 4}, ProbeContext(), "", [Retold(3, 4)]),
    ({"clashes": 4, "scripts": ["Arabic", "Cyrillic", "Latin"]}, ProbeContext(), "",
     [Garbled(4, ("Arabic", "Cyrillic", "Latin"))]),
    ({"broken_characters": 2}, ProbeContext(), "", [Garbled(broken_characters=2)]),
    ({"cached_tokens": 256, "shared_with": {"tokens": 264, "tenant": "a", "sent_at": 1.7e9},
      "own_shared": {"tokens": 0, "tenant": "b", "sent_at": None}, "salt_asserted": ["a", "b"],
      "prompt_tokens": 1024, "boundary": "prefix-cache", "status": 200},
     ProbeContext(1024, "prefix-cache", 200), "",
     [CacheUsage(256, shared_with=SharedPrefix(264, "a", 1.7e9), own_shared=SharedPrefix(0, "b", None)),
      SaltAsserted(("a", "b"))]),
    ({"cached_tokens": 384, "fresh_from": 40, "longest_shared": {"tokens": 12, "tenant": None, "sent_at": None}},
     ProbeContext(), "", [CacheUsage(384, fresh_from=40, longest_shared=SharedPrefix(12, None, None))]),
    ({"test": "binomial", "decisions": [{"counter": ABORTS, "own_events": 16.0, "own_seconds": 0.214,
                                         "background_events": 0.0, "background_seconds": 10.825,
                                         "p_value": 3.91128470666277e-28, "alpha": 0.0002}],
      "windows": [{"request": "x003-probe", "seconds": 0.01, "excess": {ABORTS: 1.0}}],
      "prompt_tokens": 4090, "boundary": "max_req_input_len", "status": 200},
     ProbeContext(4090, "max_req_input_len", 200), "",
     [CounterTest("binomial", (DECISION,), (RisenWindow("x003-probe", 0.01, {ABORTS: 1.0}),))]),
    (OLD_TIMING, ProbeContext(), "", [TIMING, SaltAsserted(("a",)), COUNTERS]),
    ({"check": "crosstalk", "streamed": True, "own_canary": "cn_2", "other_request": "ct003", "boundary": "crosstalk",
      "status": 200},
     ProbeContext(None, "crosstalk", 200), "crosstalk", [Burst(True, "cn_2", other_request="ct003")]),
    ({"cut": "deadline", "arrived_chars": 512, "prompt_tokens": 4097.5, "someday": {"x": 1}},
     ProbeContext(), "", [Envelope(cut="deadline", arrived_chars=512),
                          Unread('{"prompt_tokens": 4097.5, "someday": {"x": 1}}')]),
    ({}, ProbeContext(), "", []),
]


@pytest.mark.parametrize(("old", "context", "check", "evidence"), OLD_ROWS)
def test_rows_written_before_evidence_was_typed_read_into_the_types(
        old: dict[str, JSON], context: ProbeContext, check: str, evidence: list[Evidence]) -> None:
    assert details.read(json.dumps(old)) == (context, check, tuple(evidence))


def test_a_new_row_round_trips_exactly() -> None:
    finding = Finding(record_id="x003-probe", kind=FindingKind.CROSS_TENANT_CACHE_TIMING, detector=DetectorName.TIMING,
                      severity=Severity.HIGH, score=1.0, observer_tenant="b", check="timing",
                      context=ProbeContext(256, None, None), evidence=(TIMING, COUNTERS, SaltAsserted(("a",))))
    stored = details.written(finding)
    assert json.loads(stored)["version"] == details.VERSION
    assert details.read(stored) == (finding.context, "timing", finding.evidence)
