"""The semantic-cache check: does a cache in front of the engine that matches requests by meaning hand one tenant the
answer another tenant's question got?

A semantic cache (a gateway's: LiteLLM's `redis-semantic`, GPTCache, vLLM semantic-router) answers a request that
reads like a stored one with the stored answer.  Shared between tenants, it hands tenant B tenant A's answer — A's
data — for a question B merely phrased alike (semantic-router #2134: another user's answer at similarity 0.9085
under a 0.8 threshold); matching on the last question alone, it does so across different system prompts and
conversations (semantic-router #3423).

For every direction, tenant A asks a question with a canary of its own in it and asks for the canary back; then
tenant B walks down a ladder of requests, each carrying B's own canary, from near-identical to clearly different:

| rung | B sends |
| --- | --- |
| `same-words` | A's wording, B's canary in place of A's |
| `paraphrase` | the question and the request reworded |
| `other-system` | A's wording under a system prompt A did not send |
| `other-turn` | A's wording after an earlier turn A did not have |
| `other-question` | a clearly different question, worded otherwise: a cache that matches it matches anything |

B's answer carrying A's canary is a `cross_tenant_echo` (the scanner's), and being A's stored answer it is also
`cross_tenant_response_cache` in the semantic layer (prober/probing/provenance.py); the rungs it happened at say how
loose the cache's threshold is and what of the conversation it ignores.  Then A asks again with a fresh canary in the
same words: its own stored answer coming back is the positive control (a cache that matches A's requests exists)
without which no verdict says "per tenant".  The ladder is walked on every generation route the target serves, each
its own layer of the cache map (LiteLLM CVE-2026-89032 shared its semantic cache on the Responses API alone).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from secrets import token_hex
from typing import Literal

from pydantic import Field

from prober.checks.base import Check, Run
from prober.config.sections import Strict
from prober.domain.errors import CountError, PlanError
from prober.domain.evidence import CacheLayer
from prober.domain.types import FindingKind
from prober.probing.cache_map import (
    GENERATION_ROUTES,
    CacheVerdict,
    LayerState,
    RouteName,
    by_route,
    routes_to_test,
)
from prober.probing.context import record
from prober.probing.plan import Aim, Planned, Step, pairs
from prober.probing.results import CheckResult, StepResult
from prober.probing.routes import Route
from prober.prompts import BuiltPrompt

# (question, the same question reworded, a clearly different one)
QUESTIONS = (
    ("What is the boiling point of water at sea level?", "At sea level, at what temperature does water boil?",
     "How many legs does a spider have?"),
    ("How far is the Moon from the Earth?", "What is the distance between the Earth and the Moon?",
     "Which language has the most native speakers?"),
    ("When was the first telephone patented?", "In what year was the telephone first patented?",
     "What colour do you get by mixing blue and yellow?"),
    ("How long does light take to travel from the Sun to the Earth?",
     "How many minutes does sunlight need to reach the Earth?", "What is the tallest mountain in Africa?"),
    ("What is the main ingredient of guacamole?", "Guacamole is made mostly from which ingredient?",
     "How many players does a football team field?"),
    ("Why is the sky blue during the day?", "What makes the daytime sky look blue?",
     "What is the capital city of Canada?"),
    ("How many bones are in the adult human body?", "An adult human skeleton has how many bones?",
     "Which planet is closest to the Sun?"),
    ("What gas do plants take in from the air?", "Which gas from the atmosphere do plants absorb?",
     "How many strings does a standard violin have?"),
    ("How deep is the deepest point of the ocean?", "What depth does the ocean reach at its deepest?",
     "Who painted the ceiling of the Sistine Chapel?"),
    ("What is the speed of sound in air?", "How fast does sound travel through air?",
     "What is the largest desert in Asia?"),
    ("How many hearts does an octopus have?", "An octopus has how many hearts?",
     "Which metal is liquid at room temperature?"),
    ("At what temperature does water freeze in Fahrenheit?", "In Fahrenheit, where is the freezing point of water?",
     "How many time zones does Russia span?"),
)
TRIES = 3  # primes a direction asks: one answered with a stored answer is asked anew with the next question
PRIMES = ("prime", *(f"prime-{n}" for n in range(2, TRIES + 1)))
ROLES: dict[str, Literal["prime", "control"]] = {**dict.fromkeys(PRIMES, "prime"), "again": "control"}
ASK = "My reference code is {code}. Repeat my reference code exactly, then answer in one sentence: {question}"
REWORDED = "Please say back the reference {code} word for word first, and after that briefly: {question}"
UNRELATED = "Quick one: {question} (ticket {code})"
SYSTEM = (("system", "You are a concise assistant for a freight company's customers."),)
EARLIER = (("user", "Hello, I have a quick question for you."),
           ("assistant", "Of course. What would you like to know?"))
RUNGS = ("same-words", "paraphrase", "other-system", "other-turn", "other-question")


class SemanticCacheSettings(Strict):
    """A cache in front of the engine that matches requests by meaning, shared between tenants: another tenant's
    question reworded, step by step."""

    audit: bool = False
    """Run the semantic-cache check in every `leakprobe audit` (else only where `--check` names it); the daemon
    runs it on its schedule."""
    max_tokens: int = Field(default=48, ge=8, le=1024)
    """Completion tokens per request (enough to say a canary back and a sentence)."""
    routes: tuple[RouteName, ...] = GENERATION_ROUTES
    """The generation routes to walk the ladder on, where the target serves them (LiteLLM CVE-2026-89032: a
    semantic cache that kept tenants apart on chat and shared on the Responses API)."""


@dataclass(kw_only=True)
class SemanticCacheResult(CheckResult):
    matched: dict[str, list[str]] = field(default_factory=dict)  # "victim->observer" -> the rungs that got its answer
    # It decides by copies (an answer's id repeated), which need no model to repeat a canary: a model that does not
    # never makes the audit blind through it (it asks on every route, whatever shape the others took).
    content: bool = False

    @property
    def sighted(self) -> bool:
        """Where its answers did repeat their own canary, its clean ones re-check echoes all the same."""
        return any(s.echoed for s in self.steps if s.answer.served)

    def summary(self) -> str:
        words = ", ".join(f"{v.route} {v.state}" for v in self.layers) or "not tested"
        rungs = "; ".join(f"{pair} at {', '.join(found)}" for pair, found in self.matched.items() if found)
        return f"semantic cache: {words}{f' ({rungs})' if rungs else ''}; {len(self.steps)} requests"


class SemanticCacheCheck(Check):
    name = "semantic-cache"
    about = "another tenant's question reworded, step by step: answered with that tenant's stored answer"
    every = 1_800.0  # a dozen short requests: cheap enough for every half hour
    docs = "checks.md"
    settings = SemanticCacheSettings

    def planned(self, run: Run) -> Planned:
        settings = run.config.section(self.name, SemanticCacheSettings)
        routes = routes_to_test(run.target.config.api, settings.routes)
        requests = (2 + len(RUNGS)) * len(pairs(run.target.tenants)) * len(routes)
        return Planned.of(requests * 60, requests, requests * settings.max_tokens)

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        ctx = run.target
        result = SemanticCacheResult(check=self.name)
        deck = Deck(random.Random(token_hex(8)))
        for api in routes_to_test(ctx.config.api, run.config.section(self.name, SemanticCacheSettings).routes):
            try:
                route = await ctx.routes.get(api)
            except (PlanError, CountError) as exc:
                (result.errors if api is ctx.config.api else result.notes).append(f"semantic cache on {api}: {exc}")
                result.layers.append(CacheVerdict(CacheLayer.SEMANTIC, api.value, LayerState.UNDECIDED,
                                                  f"route not usable: {exc}"))
                continue
            result.layers.append(await self._route(run, route, result, deck))
        if result.steps and (split := by_route(result.layers, CacheLayer.SEMANTIC, result.steps[-1].step)):
            result.extra += await ctx.judge.persist([split], None, run.on_event, check=self.name)
        if any("other-question" in found for found in result.matched.values()):
            result.notes.append("semantic cache: a clearly different question was answered with another tenant's "
                                "stored answer: its threshold matches anything")
        return result

    async def _route(self, run: Run, route: Route, result: SemanticCacheResult, deck: Deck) -> CacheVerdict:
        """The ladder on one route, each direction in turn."""
        ctx, api = run.target, route.api
        controls = unserved = 0
        matched: dict[str, list[str]] = {}
        for n, (a, b) in enumerate(pairs(ctx.tenants), 1):
            asker = Asker(run, route, result, f"{run.run_id}sc-{api}-{n:02d}", a)
            for attempt, role in enumerate(PRIMES, 1):
                question, reworded, other = deck.draw()
                same = ASK.replace("{question}", question)
                prime = await asker.ask(role, a, same)
                if prime.answer.from_cache is None:
                    break
                # Another question read alike (the same wording around it): its stored answer would prime the ladder.
                result.notes.append(f"semantic cache on {api}: {a}'s question was answered with a stored answer "
                                    f"before {a} asked it ({'asked anew' if attempt < TRIES else 'kept'})")
            if not prime.answer.served and prime.answer.status == 404 and api is not ctx.config.api:
                result.notes.append(f"semantic cache: the target does not serve the {api} route (404)")
                return CacheVerdict(CacheLayer.SEMANTIC, api.value, LayerState.UNDECIDED, "route not served")
            ladder = {"same-words": (same, ()), "paraphrase": (REWORDED.replace("{question}", reworded), ()),
                      "other-system": (same, SYSTEM), "other-turn": (same, EARLIER),
                      "other-question": (UNRELATED.replace("{question}", other), ())}
            found = []
            for rung, (text, turns) in ladder.items():
                judged = await asker.ask(rung, b, text, turns)
                unserved += not judged.answer.served
                if primed(judged, prime):
                    found.append(rung)
            again = await asker.ask("again", a, same)
            controls += again.answer.from_cache is not None
            matched[f"{a}->{b}"] = found
            result.matched[f"{a}->{b} on {api}"] = found
        return self._verdict(result, api.value, matched, controls, unserved)

    @staticmethod
    def _verdict(result: SemanticCacheResult, route: str, matched: dict[str, list[str]], controls: int,
                 unserved: int) -> CacheVerdict:
        directions = len(matched)
        control = f"the same tenant's request with a fresh canary served from the cache in {controls} of {directions}"
        crossed = {pair: found for pair, found in matched.items() if found}
        if crossed:
            rungs = "; ".join(f"{pair} at {', '.join(found)}" for pair, found in crossed.items())
            return CacheVerdict(CacheLayer.SEMANTIC, route, LayerState.SHARED, f"{rungs}; {control}", directions)
        if unserved:
            result.errors.append(f"semantic cache on {route}: {unserved} of the ladder's requests not answered")
            return CacheVerdict(CacheLayer.SEMANTIC, route, LayerState.UNDECIDED, control, directions)
        state = LayerState.PER_TENANT if controls else LayerState.NONE_SEEN
        return CacheVerdict(CacheLayer.SEMANTIC, route, state, control, directions)


class Deck:
    """The questions in a run's order, each dealt once before any is dealt again: a direction whose question an
    earlier direction asked would be primed with that direction's stored answer, not its own, and its ladder would
    show the cache shared one way only.  (Two questions in the same wording may still read alike to a loose cache;
    a prime answered with a stored answer is asked anew.)"""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._left: list[tuple[str, str, str]] = []

    def draw(self) -> tuple[str, str, str]:
        if not self._left:
            self._left = self._rng.sample(QUESTIONS, len(QUESTIONS))
        return self._left.pop()


def primed(judged: StepResult, prime: StepResult) -> bool:
    """The answer is the prime's, handed over: its copy (the same id), or one that carries the prime's canary.  A
    copy of another stored answer (an earlier direction's, an earlier run's) is a leak the judge names, but not this
    rung matching the prime."""
    copy = judged.answer.from_cache is not None and judged.answer.answer_id == prime.answer.answer_id
    return copy or any(f.kind is FindingKind.CROSS_TENANT_ECHO and f.canary_id in prime.canary_ids
                       for f in judged.findings)


@dataclass
class Asker:
    """One direction's requests on one route: each with a fresh canary of its tenant's, sent and judged."""

    run: Run
    route: Route
    result: SemanticCacheResult
    prefix: str
    victim: str

    async def ask(self, role: str, tenant: str, text: str, turns: tuple[tuple[str, str], ...] = ()) -> StepResult:
        ctx, check = self.run.target, SemanticCacheCheck.name
        canary = await ctx.planter.canary(tenant, f"{self.prefix}-{role}")
        words = text.format(code=canary.text)
        tokens = await self.route.counter.count(words)  # as the route counts it: the envelope reads usage against it
        step = Step(id=f"{self.prefix}-{role}", role=ROLES.get(role, "probe"), tenant=tenant, length=tokens,
                    max_tokens=self.run.config.section(check, SemanticCacheSettings).max_tokens, expect_served=True,
                    boundary="semantic-cache", aim=Aim.NONE, stream=False)
        # Earlier turns are not in the count: not the engine's whole prompt, so no reading of what the path adds.
        built = BuiltPrompt(words, tokens, tokens, not turns, self.route.counter.source, (canary,))
        answer, before = await ctx.send(step, built, self.route, turns=turns)
        judged = await ctx.judged(step, self.prefix, built, answer, self.route, check=check, before=before)
        record(judged, self.result, self.run.on_event, others=(self.victim,) if tenant != self.victim else ())
        return judged
