"""The boundary plan: which prompt lengths to send, from whom, in what order, and what a correct engine
does with each.  Pure data from a capacity; nothing here touches the network."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from prober.capacity.limits import Capacity
from prober.domain.errors import PlanError
from prober.probing.documents import PlanDoc, PlannedDoc
from prober.targets.bounds import DECODE_FLOOR, PREFILL_FLOOR

Streaming = Literal["plain", "stream", "both"]
Ask = Literal["quote", "summarize", "translate"]  # what a probe asks of the model
# Quotes surface tokens verbatim; summaries and translations reword, so facts come out paraphrased (or in
# another language) and the semantic detector has something to find.
ASKS: tuple[Ask, ...] = ("quote", "summarize", "quote", "translate")
CACHE_CHECK_TOKENS = 1_024
# A prime's work is done once its prompt is in the pages; its answer is only read for positive controls.  So a
# prime sent on its own asks for a short answer: on a CPU or a billed API each completion token costs as much
# as the probe's.  A prime sent at the same time as its probe decodes in full, to stay in flight beside it.
PRIME_ANSWER_TOKENS = 16
SHORT_PRIME = 96  # a short prime where no page size says otherwise: room for one canary unit


ONE_PAGE = "one-page"  # the boundary label of a prime that fits one KV page with its answer
STALE_PAGE = "stale-page"  # the probe after it: over the limit, its last line past the last whole block
STALE_TAIL = 16
REPEAT = "repeat"  # the label of an A, X, A exchange's steps
SENTINEL = "sentinel"
SENTINEL_CACHE = "sentinel-cache"


class Aim(StrEnum):
    """What a step's length means when the path to the engine puts tokens in front (a gateway's system prompt)."""

    LENGTH = "length"  # what the engine must see (a boundary): the prompt is that much shorter
    PAGE = "page"  # where the request must end in the KV page in which the path's prefix ends (a one-page prime)
    NONE = "none"  # an everyday size of the prompt's own: what the engine sees is that much longer
    OWN = "own"  # the tenant's own part, the path's prefix on top, the whole under the step's `ceiling`


@dataclass(frozen=True)
class Boundary:
    label: str  # "pool+1", "advertised-1", ...
    length: int
    expect_served: bool
    aim: Aim = Aim.LENGTH
    ceiling: int | None = None  # with Aim.OWN: the most the engine may see of it, the path's prefix included


@dataclass(frozen=True, kw_only=True)
class Step:
    """One request: a priming prompt (victim's canaries in every page), a probe (asks to quote), the observer's
    first send of a probe it repeats (a lead), or a control (a tenant's own canaries, to see whether they come
    back: prober/probing/shapes.py)."""

    id: str
    role: Literal["prime", "probe", "lead", "control"]
    tenant: str
    length: int
    stream: bool
    expect_served: bool
    boundary: str = ""
    max_tokens: int = 160  # clamped so prompt + completion fit the advertised context
    ask: Ask = "quote"
    aim: Aim = Aim.LENGTH
    ceiling: int | None = None  # with Aim.OWN: the most the engine may see of it, the path's prefix included


@dataclass(frozen=True, kw_only=True)
class Exchange:
    """Prime as the victim, then probe as the observer (or both at once when `concurrent`); with a `lead`, the
    observer sends its probe once before the prime and again after it (A, X, A)."""

    id: str
    victim: str
    observer: str
    prime: Step
    probe: Step
    concurrent: bool = False
    same_text: bool = False  # the observer resends the victim's (canary-free) prompt: prefix-cache isolation
    lead: Step | None = None

    @property
    def steps(self) -> tuple[Step, ...]:
        """In the order they are sent."""
        return (self.lead, self.prime, self.probe) if self.lead else (self.prime, self.probe)

    @property
    def tokens(self) -> int:
        return sum(step.length for step in self.steps)


@dataclass
class Plan:
    target: str
    boundaries: list[Boundary]
    exchanges: list[Exchange] = field(default_factory=list)
    run_id: str = ""  # prefixes step ids, so that repeated runs (the daemon's) never reuse one
    retention_s: float | None = None  # how long its canaries stay active (None: the minter's default)
    fact_share: float = 0.0  # of the canary units in a prompt, those that also carry a fact canary
    letter: str = "x"  # its exchanges' ids (`x001`): each check that runs a plan has its own, so a run's ids differ

    @property
    def tokens(self) -> int:
        return sum(e.tokens for e in self.exchanges)

    @property
    def requests(self) -> int:
        return sum(len(e.steps) for e in self.exchanges)

    @classmethod
    def joined(cls, plans: list[Plan]) -> Plan:
        """Several checks' plans as one (for a report of everything a target was, or would be, sent)."""
        first = plans[0]
        boundaries = {b.label: b for p in plans for b in p.boundaries}
        return cls(first.target, sorted(boundaries.values(), key=lambda b: b.length),
                   [e for p in plans for e in p.exchanges], first.run_id, first.retention_s,
                   max(p.fact_share for p in plans))

    def add(self, victim: str, observer: str, boundary: Boundary, *, stream: bool, concurrent: bool,
            same_text: bool, prime_length: int, room: Callable[[int], int], ask: Ask = "quote",
            prime_label: str = "prime", repeat: bool = False, prime_aim: Aim | None = None) -> None:
        """Prime as `victim` with `prime_length` tokens, then probe `boundary` as `observer` (`repeat`: the
        observer sends the probe's prompt before the prime too)."""
        eid = f"{self.run_id}{self.letter}{len(self.exchanges) + 1:03d}"
        aim = boundary.aim
        lead = Step(id=f"{eid}-lead", role="lead", tenant=observer, length=boundary.length, stream=stream,
                    expect_served=boundary.expect_served, boundary=boundary.label,
                    max_tokens=min(room(boundary.length), PRIME_ANSWER_TOKENS), ask=ask,
                    aim=aim, ceiling=boundary.ceiling) if repeat else None
        self.exchanges.append(Exchange(
            id=eid, victim=victim, observer=observer, concurrent=concurrent, same_text=same_text, lead=lead,
            prime=Step(id=f"{eid}-prime", role="prime", tenant=victim, length=prime_length, stream=stream,
                       expect_served=True, boundary=prime_label,
                       max_tokens=room(prime_length) if concurrent else min(room(prime_length), PRIME_ANSWER_TOKENS),
                       aim=prime_aim or aim, ceiling=boundary.ceiling),
            probe=Step(id=f"{eid}-probe", role="probe", tenant=observer, length=boundary.length, stream=stream,
                       expect_served=boundary.expect_served, boundary=boundary.label,
                       max_tokens=room(boundary.length), ask=ask, aim=aim, ceiling=boundary.ceiling)))

    def to_json(self) -> PlanDoc:
        return {"target": self.target, "tokens": self.tokens,
                "boundaries": [{"label": b.label, "length": b.length, "expect": _expect(b.expect_served)}
                               for b in self.boundaries],
                "exchanges": [{"id": e.id, "victim": e.victim, "observer": e.observer, "concurrent": e.concurrent,
                               "same_text": e.same_text, "repeat": e.lead is not None,
                               "prime_tokens": e.prime.length, "probe_tokens": e.probe.length,
                               "boundary": e.probe.boundary, "stream": e.probe.stream, "ask": e.probe.ask,
                               "expect": _expect(e.probe.expect_served)} for e in self.exchanges],
                "fact_share": self.fact_share}


def _expect(served: bool) -> str:
    return "served" if served else "refused"


def acceptance_limit(capacity: Capacity) -> int | None:
    """The shortest prompt a correct engine must refuse: its scheduler limit, else what the pool or the
    advertised context can hold."""
    if capacity.max_req_input_len:
        return capacity.max_req_input_len.value
    known = [k.value for k in (capacity.pool_tokens, capacity.advertised) if k]
    return min(known) if known else None


def known_limit(capacity: Capacity) -> int:
    """`acceptance_limit`, or PlanError saying how to give it: behind a gateway that forwards no introspection the
    capacity is unknown, the ordinary case, and every check that sizes its prompts by it says so in one line."""
    limit = acceptance_limit(capacity)
    if limit is None:
        raise PlanError("capacity unknown: no advertised context, KV pool or input limit; set `capacity:` for the "
                        "target in the config or allow bisection with --bisect-budget")
    return limit


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


def prime_length(capacity: Capacity) -> int:
    """As long as a correct engine still serves, so the victim's canaries cover as many pages as possible (raises
    PlanError where the capacity is unknown)."""
    return max(1, known_limit(capacity) - 1)


def pairs(tenants: list[str]) -> list[tuple[str, str]]:
    """(victim, observer) for every direction: both ways for two tenants, a ring for more."""
    if len(tenants) < 2:
        raise PlanError("leakprobe needs at least two tenants (a victim and an observer): list them under `tenants:` "
                        "or give --tenant twice")
    if len(tenants) == 2:
        return [(tenants[0], tenants[1]), (tenants[1], tenants[0])]
    return [(tenants[i], tenants[(i + 1) % len(tenants)]) for i in range(len(tenants))]


def cache_plan(target: str, capacity: Capacity, tenants: list[str], *, streaming: Streaming = "both",
               max_tokens: int = 160, run_id: str = "", fact_share: float = 0.0) -> Plan:
    """The prefix-cache check (the observer resends the victim's canary-free prompt) and the repeat check (the
    observer's prompt, the victim's, the observer's again), every direction: prompts of the tenant's own text, with
    whatever the path puts in front on top (what a cache between tenants could serve is the part they control), the
    whole short of the acceptance limit by an answer's room (a probe that cannot answer cannot show its own canary)."""
    plan = Plan(target, [], run_id=run_id, fact_share=fact_share, letter="k")
    add = _adder(plan, capacity, max_tokens)
    ceiling = prime_length(capacity) - (max_tokens if capacity.advertised else 0)
    cache = Boundary("prefix-cache", max(1, min(CACHE_CHECK_TOKENS, ceiling)), True, aim=Aim.OWN, ceiling=ceiling)
    repeat = Boundary(REPEAT, cache.length, True, aim=Aim.OWN, ceiling=ceiling)
    plan.boundaries = [cache, repeat]
    for victim, observer in pairs(tenants):
        add(victim, observer, cache, False, False, same_text=True)
    # A, X, A: the observer's prompt, another tenant's of the same length, the observer's again (vLLM #50630,
    # llama.cpp #28056: the repeat carried the intervening request's content).
    for d, (victim, observer) in enumerate(pairs(tenants)):
        add(victim, observer, repeat, streaming == "stream" or (streaming == "both" and d % 2 == 1), False,
            first=repeat.length, repeat=True)
    return plan


def make_plan(target: str, capacity: Capacity, tenants: list[str], *, streaming: Streaming = "both",
              concurrent: bool = True, rounds: int = 1, max_tokens: int = 160, run_id: str = "",
              fact_share: float = 0.0) -> Plan:
    """The boundary campaign: every boundary in every direction, alternating plain and streaming when both are
    asked for; then, above the acceptance limit, a prime of one page (`one_page`) before the probe, and the prime
    and the probe at the same time; and, where several slots are known, two prompts at 60% of the context at once
    (the shared-pool check)."""
    plan = Plan(target, boundaries(capacity), run_id=run_id, fact_share=fact_share)
    add = _adder(plan, capacity, max_tokens)
    prime = prime_length(capacity)
    directions = pairs(tenants)
    for _ in range(rounds):
        for i, boundary in enumerate(plan.boundaries):
            for d, (victim, observer) in enumerate(directions):
                stream = streaming == "stream" or (streaming == "both" and (i + d) % 2 == 1)
                add(victim, observer, boundary, stream, False)
        above = [b for b in plan.boundaries if not b.expect_served]
        if above:  # the victim's whole request in one page, then the observer over the limit: plain and streamed
            stale = stale_page_check(above[min(1, len(above) - 1)])
            page_sized = one_page(capacity) != SHORT_PRIME  # else an everyday short prompt
            for stream in ((False, True) if streaming == "both" else (streaming == "stream",)):
                for victim, observer in directions:
                    add(victim, observer, stale, stream, False, first=min(one_page(capacity), prime),
                        prime_label=ONE_PAGE, prime_aim=Aim.PAGE if page_sized else Aim.NONE)
        if concurrent:
            if above:
                for d, (victim, observer) in enumerate(directions):
                    add(victim, observer, above[min(1, len(above) - 1)], streaming == "stream" or
                        (streaming == "both" and d % 2 == 1), True)
            shared = shared_pool_check(capacity)
            if shared is not None:
                for victim, observer in directions:
                    add(victim, observer, shared, False, True, first=shared.length)
    return plan


def _adder(plan: Plan, capacity: Capacity, max_tokens: int) -> Callable[..., None]:
    """How a plan adds an exchange: primes at the longest prompt a correct engine serves unless told otherwise,
    asks in turn, and no more completion than the context leaves."""
    prime = prime_length(capacity)
    ctx = capacity.advertised.value if capacity.advertised else None

    def room(length: int) -> int:
        """Engines refuse prompt + max_tokens over the context; a probe tests the prompt, so it asks for
        no more completion than fits (at least one token)."""
        return max(1, min(max_tokens, ctx - length)) if ctx else max_tokens

    def add(victim: str, observer: str, boundary: Boundary, stream: bool, together: bool,
            same_text: bool = False, first: int = prime, prime_label: str = "prime", repeat: bool = False,
            prime_aim: Aim | None = None) -> None:
        ask = "quote" if same_text or repeat else ASKS[len(plan.exchanges) % len(ASKS)]
        plan.add(victim, observer, boundary, stream=stream, concurrent=together, same_text=same_text,
                 prime_length=boundary.length if same_text else first, room=room, ask=ask, prime_label=prime_label,
                 repeat=repeat, prime_aim=prime_aim)

    return add


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


def sentinel_plan(target: str, tenants: list[str], *, tokens: int, max_tokens: int, run_id: str = "",
                  retention_s: float | None = None, fact_share: float = 0.0) -> Plan:
    """Everyday sizes, far from any boundary, a few hundred tokens per tenant: for each direction the
    observer first resends a canary-free prompt the victim has just sent (is the prefix cache shared?), then
    the victim sends a short canary-bearing prompt and the observer a probe of its own that asks to quote
    (does anything of the victim's reach the observer's answer: a session mix-up, a shared cache)."""
    everyday = Boundary(SENTINEL, tokens, True, aim=Aim.NONE)
    plan = Plan(target, [everyday], run_id=run_id, retention_s=retention_s, fact_share=fact_share)
    for d, (victim, observer) in enumerate(pairs(tenants)):
        for label, same_text in ((SENTINEL_CACHE, True), (SENTINEL, False)):
            plan.add(victim, observer, Boundary(label, tokens, True, aim=Aim.NONE), stream=False, concurrent=False,
                     same_text=same_text, prime_length=tokens, room=lambda _: max_tokens,
                     ask="quote" if same_text or d % 2 == 0 else "summarize")
    return plan


@dataclass(frozen=True)
class Planned:
    """What a check will send a target: prompt tokens (what a budget holds), requests, and seconds at the floors
    (prompt tokens at PREFILL_FLOOR, each request's `max_tokens` at DECODE_FLOOR: what a deadline allows)."""

    tokens: int
    requests: int
    seconds: float
    plan: Plan | None = None  # the exchanges it will send, where it runs a plan
    moot: str | None = None  # why it has nothing to check on this target (an engine without slots): not run
    unplanned: str | None = None  # why it could not be planned (the capacity unknown): not run, and the run incomplete

    @classmethod
    def of(cls, tokens: int, requests: int, answer_tokens: int, plan: Plan | None = None) -> Planned:
        return cls(tokens, requests, tokens / PREFILL_FLOOR + answer_tokens / DECODE_FLOOR, plan)

    @classmethod
    def of_plan(cls, plan: Plan) -> Planned:
        steps = [s for e in plan.exchanges for s in e.steps]
        return cls.of(plan.tokens, len(steps), sum(s.max_tokens for s in steps), plan)

    @classmethod
    def moot_because(cls, why: str) -> Planned:
        return cls(0, 0, 0.0, moot=why)

    @classmethod
    def unplanned_because(cls, why: str) -> Planned:
        return cls(0, 0, 0.0, unplanned=why)

    def to_json(self) -> PlannedDoc:
        return {"tokens": self.tokens, "requests": self.requests, "seconds": round(self.seconds, 1),
                "moot": self.moot}
