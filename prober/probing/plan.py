"""The boundary plan: which prompt lengths to send, from whom, in what order, and what a correct engine
does with each, as the plan checks build it (prober/checks: the campaign, the prefix cache, the sentinel).  Pure
data from a capacity; nothing here touches the network."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from prober.capacity.limits import Capacity
from prober.domain.errors import PlanError
from prober.probing.documents import PlanDoc, PlannedDoc
from prober.targets.bounds import DECODE_FLOOR, PREFILL_FLOOR

Streaming = Literal["plain", "stream", "both"]
Ask = Literal["quote", "summarize", "translate"]  # what a probe asks of the model
Role = Literal["prime", "probe", "lead", "control", "filler"]  # what a step is for (`Step`)
# A prime's work is done once its prompt is in the pages; its answer is only read for positive controls.  So a
# prime sent on its own asks for a short answer: on a CPU or a billed API each completion token costs as much
# as the probe's.  A prime sent at the same time as its probe decodes in full, to stay in flight beside it.
PRIME_ANSWER_TOKENS = 16
SHORT_PRIME = 96  # a short prime where no page size says otherwise: room for one canary unit


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
    first send of a probe it repeats (a lead), a control (a tenant's own canaries, to see whether they come
    back: prober/probing/shapes.py), or filler (canary-free text that evicts a cache's first tier)."""

    id: str
    role: Role
    tenant: str
    length: int
    stream: bool
    expect_served: bool
    boundary: str = ""
    max_tokens: int = 160  # clamped so prompt + completion fit the advertised context
    ask: Ask = "quote"
    aim: Aim = Aim.LENGTH
    ceiling: int | None = None  # with Aim.OWN: the most the engine may see of it, the path's prefix included
    sampled: bool = False  # asked at temperature 1 with its tokens' log-probabilities (a stored copy of it tells)


@dataclass(frozen=True, kw_only=True)
class Exchange:
    """Prime as the victim, then probe as the observer (or both at once when `concurrent`); with a `lead`, the
    observer sends its probe once before the prime and again after it (A, X, A).  `then`: the observer's further
    probes over the same pages, each sent only while the exchange is undecided; `unless_decided`: the whole
    exchange, unless an earlier one's probe as long was refused (prober/probing/exchanges.py).  `between` and
    `after`: steps sent between the prime and the probe and after the probe (the prefix-cache check's filler that
    evicts the first tier, and the observer's resend after it)."""

    id: str
    victim: str
    observer: str
    prime: Step
    probe: Step
    concurrent: bool = False
    same_text: bool = False  # the observer resends the victim's (canary-free) prompt: prefix-cache isolation
    lead: Step | None = None
    then: tuple[Step, ...] = ()
    unless_decided: str | None = None  # not sent where the exchange of this id had a probe as long refused
    between: tuple[Step, ...] = ()
    after: tuple[Step, ...] = ()

    @property
    def steps(self) -> tuple[Step, ...]:
        """In the order they are sent (`then` at most)."""
        first = (self.lead, self.prime, self.probe) if self.lead else (self.prime, *self.between, self.probe)
        return first + self.after + self.then

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
            prime_label: str = "prime", repeat: bool = False, prime_aim: Aim | None = None,
            then: Sequence[Boundary] = (), unless_decided: str | None = None) -> str:
        """Prime as `victim` with `prime_length` tokens, then probe `boundary` as `observer` (`repeat`: the
        observer sends the probe's prompt before the prime too; `then`: further boundaries it probes while
        undecided; `unless_decided`: the id of an exchange whose decision makes this one moot).  Returns its id."""
        eid = self.next_id()
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
                       max_tokens=room(boundary.length), ask=ask, aim=aim, ceiling=boundary.ceiling),
            then=tuple(Step(id=f"{eid}-probe{i}", role="probe", tenant=observer, length=b.length, stream=stream,
                            expect_served=b.expect_served, boundary=b.label, max_tokens=room(b.length), ask=ask,
                            aim=b.aim, ceiling=b.ceiling) for i, b in enumerate(then, 2)),
            unless_decided=unless_decided))
        return eid

    def next_id(self) -> str:
        """The id the next exchange added gets."""
        return f"{self.run_id}{self.letter}{len(self.exchanges) + 1:03d}"

    def to_json(self) -> PlanDoc:
        return {"target": self.target, "tokens": self.tokens,
                "boundaries": [{"label": b.label, "length": b.length, "expect": _expect(b.expect_served)}
                               for b in self.boundaries],
                "exchanges": [{"id": e.id, "victim": e.victim, "observer": e.observer, "concurrent": e.concurrent,
                               "same_text": e.same_text, "repeat": e.lead is not None,
                               "prime_tokens": e.prime.length, "probe_tokens": e.probe.length,
                               "boundary": e.probe.boundary, "stream": e.probe.stream, "ask": e.probe.ask,
                               "expect": _expect(e.probe.expect_served),
                               "then": [{"label": s.boundary, "length": s.length, "expect": _expect(s.expect_served)}
                                        for s in e.then], "unless_decided": e.unless_decided}
                              for e in self.exchanges],
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

    @property
    def served(self) -> int:
        """Prompt tokens a correct engine prefills (computes, and usually bills): a plan's steps it must serve (it
        refuses the rest before prefill); a check without a plan sends only prompts that fit, so all of them."""
        if self.plan is None:
            return self.tokens
        return sum(s.length for e in self.plan.exchanges for s in e.steps if s.expect_served)

    def to_json(self, price_per_mtok: float | None = None) -> PlannedDoc:
        """`price`: the served tokens at the target's price per million prompt tokens, where it has one."""
        return {"tokens": self.tokens, "served": self.served, "requests": self.requests,
                "seconds": round(self.seconds, 1), "moot": self.moot,
                "price": None if price_per_mtok is None else round(self.served * price_per_mtok / 1e6, 4)}
