"""The boundary plan is pure data from a capacity: checked here without any engine."""

from __future__ import annotations

import pytest

from prober.capacity import Capacity, Known
from prober.checks.campaign import make_plan
from prober.checks.prefix_cache import cache_plan
from prober.domain.errors import PlanError
from prober.probing.plan import PRIME_ANSWER_TOKENS, SHORT_PRIME, pairs

pytestmark = pytest.mark.unit


def k(value: int) -> Known:
    return Known(value, "test")


INCIDENT = Capacity(context_length=k(1_048_576), pool_tokens=k(681_280), max_req_input_len=k(681_274),
                    page_size=k(64))


def test_incident_boundaries_and_expectations() -> None:
    plan = make_plan("t", INCIDENT, ["a", "b"])
    got = [(b.label, b.length, b.expect_served) for b in plan.boundaries]
    assert got == [("max_req_input_len-1", 681_273, True), ("max_req_input_len", 681_274, False),
                   ("pool", 681_280, False), ("pool+1", 681_281, False), ("pool+page", 681_344, False),
                   ("advertised-1", 1_048_575, False), ("advertised", 1_048_576, False)]
    probes = [e for e in plan.exchanges if not e.same_text and not e.concurrent and e.prime.boundary == "prime"
              and e.lead is None]
    assert {(e.victim, e.observer) for e in probes} == {("a", "b"), ("b", "a")}
    assert {e.probe.stream for e in probes} == {True, False}
    assert all(e.prime.length == 681_273 and e.prime.expect_served for e in probes)
    assert all(e.probe.length + e.probe.max_tokens <= 1_048_576 or e.probe.max_tokens == 1 for e in plan.exchanges)
    assert not [e for e in plan.exchanges if e.same_text or e.lead is not None]  # the prefix-cache check's
    one_page = [e for e in plan.exchanges if e.prime.boundary == "one-page"]  # pages of 64: an everyday short prime
    assert [(e.prime.length, e.probe.boundary, e.probe.length, e.probe.stream) for e in one_page] == [
        (SHORT_PRIME, "stale-page", 681_280 + 16, stream) for stream in (False, False, True, True)]
    assert [e.probe.boundary for e in plan.exchanges if e.concurrent] == ["pool", "pool"]
    # A prime alone asks for a short answer (its prompt is what counts); one beside its probe stays in flight.
    assert {e.prime.max_tokens for e in plan.exchanges if not e.concurrent} == {PRIME_ANSWER_TOKENS}
    assert {(e.prime.max_tokens, e.probe.max_tokens) for e in plan.exchanges if e.concurrent} == {(160, 160)}
    assert plan.tokens == sum(s.length for e in plan.exchanges for s in e.steps)


def test_the_prefix_cache_plan_resends_and_repeats_at_one_length() -> None:
    plan = cache_plan("t", INCIDENT, ["a", "b"])
    cache = [e for e in plan.exchanges if e.same_text]
    assert len(cache) == 2 and all(e.prime.length == e.probe.length == 1_024 for e in cache)
    repeats = [e for e in plan.exchanges if e.lead is not None]  # A, X, A
    assert [(e.observer, [s.tenant for s in e.steps], [s.length for s in e.steps]) for e in repeats] == [
        ("b", ["b", "a", "b"], [1_024] * 3), ("a", ["a", "b", "a"], [1_024] * 3)]
    assert len(plan.exchanges) == len(cache) + len(repeats)


def test_a_one_page_prime_fits_a_vllm_block_with_its_answer() -> None:
    """vLLM gives the next request the uncached block freed last as its first: a victim's whole request in one
    128-token block, then the observer just over the pool (the hand-off fault's threshold in the fire drill)."""
    vllm = Capacity(engine="vllm", context_length=k(1_024), pool_tokens=k(256), page_size=k(128))
    plan = make_plan("t", vllm, ["a", "b"], max_tokens=32, streaming="plain")
    one_page = [e for e in plan.exchanges if e.prime.boundary == "one-page"]
    assert [(e.victim, e.observer) for e in one_page] == [("a", "b"), ("b", "a")]
    assert all(e.prime.length + e.prime.max_tokens < 128 and e.probe.length == 257 + 16 for e in one_page)


def test_slots_add_the_shared_pool_check_and_unknowns_fail() -> None:
    llama = Capacity(engine="llama.cpp", context_length=k(1_024), slots=k(2))
    plan = make_plan("t", llama, ["a", "b"], streaming="plain", max_tokens=32)
    assert [(b.label, b.expect_served) for b in plan.boundaries] == [("advertised-1", True), ("advertised", False)]
    shared = [e for e in plan.exchanges if e.probe.boundary == "shared-pool"]
    assert len(shared) == 2 and all(e.concurrent and e.prime.length == e.probe.length == 615 for e in shared)
    assert not any(e.probe.stream for e in plan.exchanges)
    with pytest.raises(PlanError, match="capacity unknown"):
        make_plan("t", Capacity(), ["a", "b"])
    with pytest.raises(PlanError, match="two tenants"):
        make_plan("t", INCIDENT, ["a"])


def test_three_tenants_form_a_ring() -> None:
    assert pairs(["a", "b", "c"]) == [("a", "b"), ("b", "c"), ("c", "a")]
