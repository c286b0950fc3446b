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


def test_the_thorough_matrix_primes_every_boundary_in_every_direction() -> None:
    plan = make_plan("t", INCIDENT, ["a", "b"], thorough=True)
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


def test_the_spare_plan_primes_once_per_direction_and_probes_the_rest_while_undecided() -> None:
    """At the incident's sizes: a prime, then the probe just over the pool (beside the prime in the second
    direction); a one-page prime and the stale-page probe over the pages both left, which probes the other
    boundaries over the limit, likeliest first, and whose repeats (plain and streamed, both directions) are sent
    only while it is undecided; a short served probe for sight."""
    plan = make_plan("t", INCIDENT, ["a", "b"])
    got = [(e.id, e.victim, e.prime.boundary, e.prime.length, e.probe.boundary, e.probe.length, e.concurrent,
            e.probe.stream, [s.boundary for s in e.then], e.unless_decided) for e in plan.exchanges]
    stale = 681_281 + 16
    assert got == [
        ("x001", "a", "prime", 681_273, "pool+1", 681_281, False, False, [], None),
        ("x002", "a", "one-page", SHORT_PRIME, "stale-page", stale, False, True,
         ["advertised", "max_req_input_len", "pool", "pool+page", "advertised-1"], None),
        ("x003", "a", "one-page", SHORT_PRIME, "stale-page", stale, False, False, [], "x002"),
        ("x004", "a", "prime", 681_273, "pool+1", 681_281, True, True, [], "x001"),
        ("x005", "b", "prime", 681_273, "pool+1", 681_281, False, True, [], None),
        ("x006", "b", "one-page", SHORT_PRIME, "stale-page", stale, False, False, [], "x002"),
        ("x007", "b", "one-page", SHORT_PRIME, "stale-page", stale, False, True, [], "x002"),
        ("x008", "a", "one-page", SHORT_PRIME, "sight", 1_024, False, False, [], None)]
    assert {s.tenant for s in plan.exchanges[1].then} == {"b"} and not any(s.expect_served
                                                                          for s in plan.exchanges[1].then)
    assert plan.exchanges[-1].probe.ask == "quote" and plan.exchanges[-1].probe.expect_served
    # Sent at most 11M (everything undecided), 2M of it served; the matrix sends 26M.
    assert plan.tokens == 10_955_403 < make_plan("t", INCIDENT, ["a", "b"], thorough=True).tokens // 2
    served = sum(s.length for e in plan.exchanges for s in e.steps if s.expect_served)
    assert served == 3 * 681_273 + 5 * SHORT_PRIME + 1_024
    sequential = make_plan("t", INCIDENT, ["a", "b"], concurrent=False, streaming="stream")
    assert not any(e.concurrent for e in sequential.exchanges) and all(e.probe.stream for e in sequential.exchanges)
    assert len([e for e in sequential.exchanges if e.probe.boundary == "stale-page"]) == 2  # one per direction
    assert len(sequential.exchanges) == len(plan.exchanges) - 3


def test_a_served_boundary_other_than_the_prime_gets_its_own_prime() -> None:
    """Where the pool is longer than the context, the advertised context less one is served, as is the prime; where a
    served boundary is shorter than the prime, it is primed and probed in each direction."""
    small_pool = Capacity(context_length=k(8_192), pool_tokens=k(4_096), max_req_input_len=k(6_000), page_size=k(16))
    plan = make_plan("t", small_pool, ["a", "b"], streaming="plain")
    served = [e for e in plan.exchanges if e.probe.expect_served]
    assert [(e.victim, e.probe.boundary) for e in served] == [
        ("a", "pool"), ("a", "pool+1"), ("a", "pool+page"), ("b", "pool"), ("b", "pool+1"), ("b", "pool+page"),
        ("a", "sight")]
    refused = [(e.probe.boundary, e.probe.length, [s.boundary for s in e.then]) for e in plan.exchanges
               if not e.probe.expect_served]  # no pool+1 over the limit: the shortest refused first
    assert refused == [("max_req_input_len", 6_000, []), ("stale-page", 6_016, ["advertised", "advertised-1"]),
                       ("max_req_input_len", 6_000, []),  # plain only: one stale-page exchange each way
                       ("max_req_input_len", 6_000, []), ("stale-page", 6_016, [])]


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
    one_page = [e for e in plan.exchanges if e.probe.boundary == "stale-page"]
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


def test_the_lower_tier_plan_evicts_the_pool_twice_per_direction() -> None:
    """Said to have a second tier: per direction the victim's prompt, filler of the pool's size (+1,024) in prompts the
    engine serves, the observer's resend, filler again, its resend once more; 2,735,360 tokens at the incident's."""
    from prober.checks.prefix_cache import EVICTED, OWN_AGAIN, lower_plan

    plan = cache_plan("t", INCIDENT, ["a", "b"])
    lower_plan(plan, INCIDENT, ["a", "b"])
    tiered = [e for e in plan.exchanges if e.between]
    assert [(e.victim, e.observer) for e in tiered] == [("a", "b"), ("b", "a")]
    steps = tiered[0].steps
    assert [(s.role, s.tenant, s.boundary) for s in steps] == [
        ("prime", "a", "prime"), ("filler", "b", "filler"), ("filler", "b", "filler"), ("probe", "b", EVICTED),
        ("filler", "b", "filler"), ("filler", "b", "filler"), ("probe", "b", OWN_AGAIN)]
    assert sum(s.length for s in steps if s.role == "filler") == 2 * (681_280 + 1_024)
    assert all(s.length <= 681_274 for s in steps) and sum(e.tokens for e in tiered) == 2_735_360
    with pytest.raises(PlanError, match="pool_tokens"):
        lower_plan(plan, Capacity(context_length=k(8_192)), ["a", "b"])
