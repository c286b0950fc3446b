"""Planting canaries: minted and persisted before any prompt carries them, indexed for the scanner, built into
a prompt whose word shingles are in the ledger before it is sent.  Everything a request carries of its tenant
passes through here first."""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from functools import cache, partial
from itertools import cycle, islice

from prober.canaries.packs import load_pack
from prober.domain.types import Canary
from prober.probing.plan import Aim, Plan, Step
from prober.probing.routes import Route
from prober.probing.wiring import Wiring
from prober.prompts import BuiltPrompt
from prober.prompts.builder import Facts
from prober.text.shingles import Shingler

PRIME_INSTRUCTION = "Summarize the document."
ASKED = {"quote": "Quote the document word for word, including every reference code.",
         "summarize": "Summarize the document, keeping every name, place and number.",
         "translate": "Translate the document into {language}, keeping every name, place and number."}
LANGUAGE_NAMES = {"en": "English", "ko": "Korean"}
DISTINCT_PER_PROMPT = 16  # canaries cycle through a prompt: each names its tenant and step
FACT_SAMPLES = 6  # unplanted facts whose length sizes a prompt's canary units


class Planter:
    def __init__(self, wiring: Wiring) -> None:
        self.wiring = wiring

    async def prompt(self, step: Step, instruction: str, route: Route, plan: Plan, *, page: int | None,
                     cue: bool, lead: bool = False, nonce: str | None = None) -> BuiltPrompt:
        """Filler seeded by the step's place in the plan, not by its run: a repeated plan (the daemon's
        sentinels) reuses the segment costs the builder has already measured; only the canaries are new.  A cue
        layout's probe carries its tenant's canary in its first unit only (`PromptBuilder.build`'s `lead`): on a
        sound engine the model finishes the cue with it, over a stale first page with the victim's.  Sized for
        what the route's path puts in front (`content_length`; raises BuildError where it leaves no room)."""
        wiring = self.wiring
        length = await content_length(step, route, page, instruction, cue=cue, nonce=nonce)
        language = wiring.languages.get(step.tenant, "en")
        tokens = self._minting(partial(wiring.minter.tokens, step.tenant, probe_id=step.id,
                                       retention_s=plan.retention_s))
        facts = None
        if wiring.minter.embedder is not None and plan.fact_share > 0:
            mint_facts = self._minting(partial(wiring.minter.facts, step.tenant, probe_id=step.id, language=language,
                                               retention_s=plan.retention_s))
            facts = Facts(fact_samples(language), mint_facts, plan.fact_share)
        built = await route.builder.build(length, instruction=instruction, mint=tokens, facts=facts,
                                          page_size=page, seed=zlib.crc32(step.id.removeprefix(plan.run_id).encode())
                                          & 0xFFFF, cue=cue, lead=lead, nonce=nonce)
        # Before it is sent, what it leaves in the ledger: keyed hashes of its word shingles (never its text), so a
        # run of it in another tenant's answer is attributed (detection helper's hook).
        now = time.time()
        retention = plan.retention_s if plan.retention_s is not None else wiring.minter.retention_seconds
        record = Shingler(wiring.minter.key).record(built.text, step.tenant, step.id, now, now + retention)
        await asyncio.to_thread(wiring.ledger.add_prompt_shingles, [record])
        wiring.scanner.add_prompts([record])
        return built.through(path_aimed(step, route))

    @staticmethod
    async def plain(step: Step, route: Route, nonce: str) -> BuiltPrompt:
        """A canary-free prompt of fresh words led by `nonce` (the prefix-cache check's prime), unique to this run,
        so nothing the observer sent before (in any run) shares its prefix; sized like `prompt`'s."""
        length = await content_length(step, route, None, ASKED["quote"], nonce=nonce)
        built = await route.builder.build(length, instruction=ASKED["quote"], nonce=nonce, seed=int(nonce[:4], 16))
        return built.through(path_aimed(step, route))

    async def canary(self, tenant: str, request_id: str) -> Canary:
        """One token canary for one request (the cross-talk burst's)."""
        [canary] = await asyncio.to_thread(self.wiring.minter.tokens, tenant, 1, request_id)
        self.wiring.scanner.add([canary])
        return canary

    def _minting(self, make: Callable[[int], list[Canary]]) -> Callable[[int], Awaitable[list[Canary]]]:
        async def mint(count: int) -> list[Canary]:
            # Persisted by the minter before this returns: before any prompt that carries them exists.
            distinct = await asyncio.to_thread(make, min(count, DISTINCT_PER_PROMPT))
            self.wiring.scanner.add(distinct)
            return list(islice(cycle(distinct), count))
        return mint


@cache
def fact_samples(language: str) -> tuple[str, ...]:
    """The same few facts of a pack for every build, so the builder's measurements of them are reused."""
    rng = random.Random(FACT_SAMPLES)
    return tuple(load_pack(language).mint(rng).text for _ in range(FACT_SAMPLES))


def instruction(step: Step, languages: Mapping[str, str]) -> str:
    """What a probe asks; a translation goes into the language the observer does not write in, so its own canaries
    (and any other tenant's that leak) come out in the other language."""
    other = "ko" if languages.get(step.tenant, "en") == "en" else "en"
    return ASKED[step.ask].format(language=LANGUAGE_NAMES[other])


def path_aimed(step: Step, route: Route) -> int:
    """What the path is taken to add to this step's prompt: the most it was seen to add where the engine must serve
    it, the least where it must refuse it (prober/probing/path.py)."""
    return route.path.aimed(step.tenant, must_fit=step.expect_served)


async def content_length(step: Step, route: Route, page: int | None, instruction: str, *, cue: bool = False,
                         nonce: str | None = None) -> int:
    """How many tokens to write, as the route counts, for `step` behind its path: a length the engine must see less
    the path's prefix; a one-page prime less the part of its page the prefix fills (so that the request ends in
    the page where the prefix ends, where the engine puts it); an everyday size as it is, but never below what one
    canary takes (a usage-calibrated counter counts the path's prefix); the tenant's own part of a prompt whose
    whole must stay under a ceiling (`Step.ceiling`) at most what the ceiling leaves behind the path."""
    overhead = path_aimed(step, route)
    if step.aim is Aim.LENGTH:
        return step.length - overhead
    if step.aim is Aim.PAGE:
        return step.length - (overhead % page if page else overhead)
    own = max(step.length, await route.builder.shortest(instruction, cue=cue, nonce=nonce))
    if step.aim is Aim.OWN and step.ceiling is not None:
        return min(own, step.ceiling - overhead)
    return own
