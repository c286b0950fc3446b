"""The boundary campaign: prompts just below, at and above the KV pool and the advertised context, each tenant's
canaries primed, another tenant's probe after them.  By default it spends like an engineer would: one prime per
direction per pool fill, the likeliest boundary first, the rest only while undecided (`spare`); `thorough` sends
the whole matrix."""

from __future__ import annotations

from prober.capacity.known_bugs import Releases
from prober.capacity.limits import Capacity
from prober.checks.base import Run
from prober.checks.bugs import EngineBug
from prober.checks.plans import LONG_PROMPTS, Adder, PlanCheck, adder
from prober.domain.types import FindingKind
from prober.probing.plan import (
    PRIME_ANSWER_TOKENS,
    SHORT_PRIME,
    Aim,
    Boundary,
    Plan,
    Streaming,
    acceptance_limit,
    known_limit,
    pairs,
    prime_length,
)
from prober.targets.api import Engine

ONE_PAGE = "one-page"  # the boundary label of a prime that fits one KV page with its answer
STALE_PAGE = "stale-page"  # the probe after it: over the limit, its last line past the last whole block
STALE_TAIL = 16
SIGHT = "sight"  # the spare campaign's served probe: a prompt every engine serves, whose canaries must come back
SIGHT_TOKENS = 1_024  # its own part; what the engine sees, a path's prefix included, stays under the prime's length


# The public engine bugs it catches, as the reference engine reproduces each (the bug table: docs/testbed.md).
BUGS = (
    EngineBug("SGLang #30233, #38704, #38935", "an over-long prompt aborted into a 1-token placeholder that the "
              "prefill-to-decode hand-off forwards; decode attends over pages it never received (the incident)",
              {"abort_flag_unsynced": True, "decode_skips_page_check": True},
              "boundary probes just over the KV pool, primed by a canary-dense prompt", FindingKind.CROSS_TENANT_ECHO,
              checks=("campaign",), real_lm=True,
              # Its author's word on #38935: the stale KV ends with #36988, first released in 0.5.20.
              releases=(Releases(Engine.SGLANG, fixed_in="0.5.20"),)),
    EngineBug("SGLang #33507, #35421", "an aborted request answered HTTP 200 with `finish_reason: length` (or "
              "garbage) instead of an error", {"usage_reports_placeholder": True},
              "boundary probes over the pool, with the engine's counters read around each (SGLang's "
              "`num_aborted_requests`)", FindingKind.COUNTED_FAILURE, checks=("campaign",),
              releases=(Releases(Engine.SGLANG),)),
    EngineBug("SGLang #33507, under vLLM's counters", "the same HTTP 200 for an abort, on an engine that exports "
              "vLLM's metrics (`request_success{finished_reason=\"abort\"}`, `nixl_num_failed_transfers`)",
              {"usage_reports_placeholder": True},
              "boundary probes over the pool, with the engine's counters read around each (vLLM's "
              "`request_success{finished_reason=\"abort\"}`)", FindingKind.COUNTED_FAILURE, checks=("campaign",),
              engine={"metrics": "vllm"}, releases=(Releases(Engine.SGLANG),)),
)


class CampaignCheck(PlanCheck):
    name = "campaign"
    about = "the boundary campaign: token-exact prompts below, at and above the KV pool and the advertised context"
    every = 21_600.0
    bugs = BUGS
    sees_with = LONG_PROMPTS
    survey = True  # plans from a fresh survey: the capacity may have changed

    def plan(self, run: Run) -> Plan:
        a, ctx = run.config.audit, run.target
        return make_plan(ctx.config.name, ctx.capacity, ctx.tenants, streaming=a.streaming, concurrent=a.concurrent,
                         rounds=a.rounds, max_tokens=a.max_tokens, run_id=run.run_id, fact_share=ctx.wiring.fact_share,
                         thorough=a.thorough)


def boundaries(capacity: Capacity) -> list[Boundary]:
    limit = known_limit(capacity)
    candidates: list[tuple[str, int]] = []
    if capacity.max_req_input_len:
        m = capacity.max_req_input_len.value
        candidates += [("max_req_input_len-1", m - 1), ("max_req_input_len", m)]
    if capacity.pool_tokens:
        pool = capacity.pool_tokens.value
        page = capacity.page_size.value if capacity.page_size else 1
        candidates += [("pool", pool), ("pool+1", pool + 1), ("pool+page", pool + max(page, 2))]
    if capacity.advertised:
        ctx = capacity.advertised.value
        candidates += [("advertised-1", ctx - 1), ("advertised", ctx)]
    if not capacity.max_req_input_len and not capacity.pool_tokens:
        candidates.append(("limit-1", limit - 1))
    ceiling = capacity.advertised.value if capacity.advertised else max(v for _, v in candidates)
    seen: dict[int, str] = {}
    for label, length in candidates:
        if 0 < length <= ceiling and length not in seen:
            seen[length] = label
    return [Boundary(label, length, length < limit) for length, label in sorted(seen.items())]


def make_plan(target: str, capacity: Capacity, tenants: list[str], *, streaming: Streaming = "both",
              concurrent: bool = True, rounds: int = 1, max_tokens: int = 160, run_id: str = "",
              fact_share: float = 0.0, thorough: bool = False) -> Plan:
    """The boundary campaign, `rounds` times over: `spare` unless `thorough`; then, where several slots are known,
    two prompts at 60% of the context at once in each direction (the shared-pool check)."""
    plan = Plan(target, boundaries(capacity), run_id=run_id, fact_share=fact_share)
    add = adder(plan, capacity, max_tokens)
    directions = pairs(tenants)
    for _ in range(rounds):
        (matrix if thorough else spare)(plan, add, capacity, directions, streaming, concurrent)
        shared = shared_pool_check(capacity)
        if concurrent and shared is not None:
            for victim, observer in directions:
                add(victim, observer, shared, False, True, first=shared.length)
    return plan


def spare(plan: Plan, add: Adder, capacity: Capacity, directions: list[tuple[str, str]], streaming: Streaming,
          concurrent: bool) -> None:
    """One pool-filling prime per direction, probed while its pages are there: the observer's probe at the
    likeliest boundary after it.  In the first direction then the victim's one-page prime and the observer's
    stale-page probe over the pages both primes left, which goes on to every other boundary over the limit, each only
    while undecided (a refused probe decides every longer one).  Unless an exchange's probe was refused (a real
    model repeats stale context only now and then; after a leak, which directions leak, and the engine's counters'
    windows), more of its kind: the stale-page exchange plain and streamed in every direction; in the first, the
    prime and its probe at the same time (where `concurrent`: in one direction, so that four campaigns a day at
    most fit the default budget at the incident's sizes).  Last, a short prompt of the observer's that every engine
    serves: the campaign's sight (its own canaries must come back).  A served boundary shorter than the prime gets a
    prime in each direction: a served probe fills the pool with the observer's own prompt."""
    prime = prime_length(capacity)
    above = likeliest_first([b for b in plan.boundaries if not b.expect_served])
    short = min(one_page(capacity), prime)
    first: str | None = None  # the first stale-page exchange: the others are sent while it is undecided
    for d, (victim, observer) in enumerate(directions):
        stream = streaming == "stream" or (streaming == "both" and d % 2 == 1)
        other = stream if streaming != "both" else not stream
        for boundary in (b for b in plan.boundaries if b.expect_served and b.length != prime):
            add(victim, observer, boundary, stream, False)
        if not above:
            continue
        catch = add(victim, observer, above[0], stream, False)
        stale = stale_page_check(above[0])
        for s in (other, stream) if streaming == "both" else (stream,):
            eid = add(victim, observer, stale, s, False, first=short, prime_label=ONE_PAGE,
                      prime_aim=page_aim(capacity), then=() if first else above[1:], unless_decided=first)
            first = first or eid
        if concurrent and d == 0:
            add(victim, observer, above[0], other, True, unless_decided=catch)
    victim, observer = directions[0]
    add(victim, observer, Boundary(SIGHT, min(SIGHT_TOKENS, prime), True, Aim.OWN, ceiling=prime),
        streaming == "stream", False, first=short, prime_label=ONE_PAGE, prime_aim=page_aim(capacity), ask="quote")


def matrix(plan: Plan, add: Adder, capacity: Capacity, directions: list[tuple[str, str]], streaming: Streaming,
           concurrent: bool) -> None:
    """The whole matrix (`--thorough`): every boundary in every direction with a prime of its own, alternating plain
    and streaming when both are asked for; above the acceptance limit, a one-page prime before the probe, plain and
    streamed; and the prime and the probe at the same time."""
    for i, boundary in enumerate(plan.boundaries):
        for d, (victim, observer) in enumerate(directions):
            stream = streaming == "stream" or (streaming == "both" and (i + d) % 2 == 1)
            add(victim, observer, boundary, stream, False)
    above = [b for b in plan.boundaries if not b.expect_served]
    if not above:
        return
    stale = stale_page_check(above[min(1, len(above) - 1)])
    prime = prime_length(capacity)
    for stream in ((False, True) if streaming == "both" else (streaming == "stream",)):
        for victim, observer in directions:
            add(victim, observer, stale, stream, False, first=min(one_page(capacity), prime), prime_label=ONE_PAGE,
                prime_aim=page_aim(capacity))
    if concurrent:
        for d, (victim, observer) in enumerate(directions):
            add(victim, observer, above[min(1, len(above) - 1)], streaming == "stream" or
                (streaming == "both" and d % 2 == 1), True)


def likeliest_first(above: list[Boundary]) -> list[Boundary]:
    """Over-limit boundaries by how likely each is to catch a leak: just over the pool (where the incident's engine
    aborted into a placeholder and decoded over leftovers), else the shortest the engine must refuse (the least
    that proves a refusal); then the advertised context; then the rest, shortest first."""
    if not above:
        return []
    first = next((b for b in above if b.label == "pool+1"), min(above, key=lambda b: b.length))
    rest = sorted((b for b in above if b is not first), key=lambda b: (b.label != "advertised", b.length))
    return [first, *rest]


def page_aim(capacity: Capacity) -> Aim:
    """A one-page prime aims at its page where it fills one; an everyday short prompt is as long as it is."""
    return Aim.PAGE if one_page(capacity) != SHORT_PRIME else Aim.NONE


def one_page(capacity: Capacity) -> int:
    """A prime that fits one KV page with its answer.  vLLM hands the block a request freed last, if it was never
    filled (so never cached), to the next request as its first block: an observer whose first block the engine
    claims but never writes then reads the victim's tokens at the positions they were written for, which a real
    model can repeat.  Engines with pages too small for a canary get an everyday short prompt."""
    page = capacity.page_size.value if capacity.page_size else 0
    return page - PRIME_ANSWER_TOKENS - 1 if page >= SHORT_PRIME + PRIME_ANSWER_TOKENS else SHORT_PRIME


def stale_page_check(over: Boundary) -> Boundary:
    """The observer's probe after a one-page prime: over the limit by `STALE_TAIL` more tokens than `over`, so that
    an engine that claims every whole block of the prompt without writing it (the hand-off fault) still computes
    the prompt's last line, the request the model answers."""
    return Boundary(STALE_PAGE, over.length + STALE_TAIL, False)


def shared_pool_check(capacity: Capacity) -> Boundary | None:
    """With several slots, two prompts that each fit the advertised context but not one pool together:
    where slots share one KV pool (llama.cpp --kv-unified) this shows what the engine does then."""
    limit = acceptance_limit(capacity)
    if not (capacity.slots and capacity.slots.value > 1 and capacity.advertised and limit):
        return None
    return Boundary("shared-pool", min(limit - 1, -(-capacity.advertised.value * 3 // 5)), True)
