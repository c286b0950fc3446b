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
without which no verdict says "per tenant".
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from secrets import token_hex
from typing import Literal

from pydantic import Field

from prober.checks.base import Check, Run
from prober.config.sections import Strict
from prober.domain.evidence import CacheLayer
from prober.domain.types import FindingKind
from prober.probing.cache_map import CacheVerdict, LayerState
from prober.probing.context import record
from prober.probing.plan import Aim, Planned, Step, pairs
from prober.probing.results import CheckResult, StepResult
from prober.probing.routes import Route
from prober.prompts import BuiltPrompt
from prober.targets.api import Api

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
)
ASK = "My reference code is {code}. Repeat my reference code exactly, then answer in one sentence: {question}"
REWORDED = "Please say back the reference {code} word for word first, and after that briefly: {question}"
UNRELATED = "Quick one: {question} (ticket {code})"
SYSTEM = (("system", "You are a concise assistant for a freight company's customers."),)
EARLIER = (("user", "Hello, I have a quick question for you."),
           ("assistant", "Of course. What would you like to know?"))
ROLES: dict[str, Literal["prime", "control"]] = {"prime": "prime", "again": "control"}
RUNGS = ("same-words", "paraphrase", "other-system", "other-turn", "other-question")


class SemanticCacheSettings(Strict):
    """A cache in front of the engine that matches requests by meaning, shared between tenants: another tenant's
    question reworded, step by step."""

    audit: bool = False
    """Run the semantic-cache check in every `leakprobe audit` (else only where `--check` names it); the daemon
    runs it on its schedule."""
    max_tokens: int = Field(default=48, ge=8, le=1024)
    """Completion tokens per request (enough to say a canary back and a sentence)."""


@dataclass(kw_only=True)
class SemanticCacheResult(CheckResult):
    matched: dict[str, list[str]] = field(default_factory=dict)  # "victim->observer" -> the rungs that got its answer
    # It decides by copies (an answer's id repeated), which need no model to repeat a canary: a model that does not
    # never makes the audit blind through it (it always asks on the chat route, whatever shape the others took).
    content: bool = False

    @property
    def sighted(self) -> bool:
        """Where its answers did repeat their own canary, its clean ones re-check echoes all the same."""
        return any(s.own_echoes for s in self.steps if s.answer.served)

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
        requests = (2 + len(RUNGS)) * len(pairs(run.target.tenants))
        return Planned.of(requests * 60, requests, requests * settings.max_tokens)

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        ctx = run.target
        result = SemanticCacheResult(check=self.name)
        route = await ctx.routes.get(Api.CHAT) if ctx.config.api.openai_routes else await ctx.route()
        rng = random.Random(token_hex(8))
        controls = unserved = 0
        for n, (a, b) in enumerate(pairs(ctx.tenants), 1):
            question, reworded, other = rng.choice(QUESTIONS)
            asker = Asker(run, route, result, f"{run.run_id}sc{n:02d}", a)
            same = ASK.replace("{question}", question)
            prime = await asker.ask("prime", a, same)
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
            result.matched[f"{a}->{b}"] = found
        result.layers.append(self._verdict(result, route.api.value, controls, unserved))
        if any("other-question" in found for found in result.matched.values()):
            result.notes.append("semantic cache: a clearly different question was answered with another tenant's "
                                "stored answer: its threshold matches anything")
        return result

    @staticmethod
    def _verdict(result: SemanticCacheResult, route: str, controls: int, unserved: int) -> CacheVerdict:
        directions = len(result.matched)
        control = f"the same tenant's request with a fresh canary served from the cache in {controls} of {directions}"
        crossed = {pair: found for pair, found in result.matched.items() if found}
        if crossed:
            rungs = "; ".join(f"{pair} at {', '.join(found)}" for pair, found in crossed.items())
            return CacheVerdict(CacheLayer.SEMANTIC, route, LayerState.SHARED, f"{rungs}; {control}", directions)
        if unserved:
            result.errors.append(f"semantic cache: {unserved} of the ladder's requests not answered")
            return CacheVerdict(CacheLayer.SEMANTIC, route, LayerState.UNDECIDED, control, directions)
        state = LayerState.PER_TENANT if controls else LayerState.NONE_SEEN
        return CacheVerdict(CacheLayer.SEMANTIC, route, state, control, directions)


def primed(judged: StepResult, prime: StepResult) -> bool:
    """The answer is the prime's, handed over: its copy (the same id), or one that carries the prime's canary.  A
    copy of another stored answer (an earlier direction's, an earlier run's) is a leak the judge names, but not this
    rung matching the prime."""
    copy = judged.answer.from_cache is not None and judged.answer.answer_id == prime.answer.answer_id
    return copy or any(f.kind is FindingKind.CROSS_TENANT_ECHO and f.canary_id in prime.canary_ids
                       for f in judged.findings)


@dataclass
class Asker:
    """One direction's requests: each with a fresh canary of its tenant's, sent on the chat route and judged."""

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
