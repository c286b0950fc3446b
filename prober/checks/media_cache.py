"""The media cache: is the image one tenant sent read back in another tenant's answer?

Multimodal engines cache an image's processed features (its embeddings) under a key, and have keyed it by what the
client says or by too little of the image: vLLM took a client's media `uuid` as the sole key ("a client that knew
another client's uuid could retrieve that client's processed media", #55547, #55439, PR #53471), LMCache cut image
hashes to 16 bits (#3301, #4086), Dynamo hashed the pixels without the shape (PR #8340: 30x150 and 150x30
collide), SGLang cut them to 64 bits (#25462).  For each ordered pair of tenants, per probe, the victim sends a
card (prober/media/card.py) that shows a fresh canary of its own, and then the observer sends:

- `collision`: a card of its own canary whose digest (prober/media/digest.py) agrees with the victim's in its low
  `hash_bits` bits, found by search (bounded by `search_seconds`);
- `uuid-reuse`: a card of its own canary under the uuid the victim's card went under — a card of the same size, so
  that an engine that serves the victim's features does so silently instead of failing on a length mismatch
  (#55546 took a whole deployment down);
- `uuid-only`: that uuid with no image (vLLM's reference to an image cached earlier): a sound engine refuses it;
- `reshaped`: the victim's very pixel bytes with width and height swapped, an image nobody reads a code in.

Every answer is scanned: the victim's canary in the observer's answer is a `cross_tenant_echo`.  The cards that
show their sender's own canary are the check's sight.  A target that takes no images (its first card refused with
a 4xx, or a 5xx that says so, as llama.cpp without `--mmproj` answers) makes the check moot; one that refuses the
`uuid` field leaves the uuid probes out, and says so.  The collision is built against the reference digest, so on a
real stack it tests an engine that cuts that digest only; the uuid probes and the reshaped image need nothing of
the engine's hash.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from dataclasses import dataclass
from typing import Literal

from prober.capacity.known_bugs import Releases
from prober.checks.base import Check, Run
from prober.checks.bugs import EngineBug
from prober.config.schema import ProberConfig
from prober.domain.types import Canary, FindingKind
from prober.media import card
from prober.media.digest import colliding, cut, digest
from prober.media.png import Bitmap, data_url
from prober.probing.context import record
from prober.probing.events import PlanReady
from prober.probing.exchanges import counterpart
from prober.probing.plan import Aim, Exchange, Plan, Planned, Step, pairs
from prober.probing.results import CheckResult, Sight
from prober.probing.routes import Route
from prober.prompts import BuiltPrompt
from prober.targets.api import Api, Engine
from prober.targets.base import Media, Prompt
from prober.targets.bounds import DECODE_FLOOR, PREFILL_FLOOR
from prober.targets.result import Completion, ErrorKind

Probe = Literal["collision", "uuid-reuse", "uuid-only", "reshaped"]
# The collision's victim card goes first and carries no uuid: a target that refuses images is told apart from one
# that refuses the uuid field.
PROBES: tuple[Probe, ...] = ("collision", "uuid-reuse", "uuid-only", "reshaped")
ASK = "What is the code word written in the image? Repeat the code word exactly."
PROMPT_TOKENS = 48  # a bound on the ask's tokens with a chat template, for budgets (the image's come on top)
# How engines that take no images say so on a 5xx (a 4xx on a plain image part says it by itself): llama.cpp
# without a projector ("image input is not supported - hint: … mmproj"), vLLM ("… is not a multimodal model").
NO_IMAGES = re.compile(r"image input is not supported|not a multi-?modal model|mmproj|"
                       r"does not support (?:image|vision|multi-?modal)", re.IGNORECASE)


def refuses_images(answer: Completion) -> str | None:
    """Why a target's answer to a plain image part says it takes no images (None: it does not say so)."""
    error = answer.error
    if answer.served or error is None or error.status is None:
        return None
    refused = error.kind is ErrorKind.REFUSED and 400 <= error.status < 500
    says_so = error.kind in (ErrorKind.REFUSED, ErrorKind.SERVER_ERROR) and NO_IMAGES.search(error.message)
    return f"the target takes no images (HTTP {error.status}: {error.message[:200]})" if refused or says_so else None


@dataclass(kw_only=True)
class MediaResult(CheckResult):
    @property
    def sight(self) -> Sight | None:
        """Of the served cards that showed their sender's own canary, how many it read back."""
        own = [s for s in self.steps if s.canary_ids and s.answer.served]
        return Sight(len(own), sum(1 for s in own if s.echoed)) if own else None


def _step(eid: str, role: Literal["prime", "probe"], tenant: str, probe: Probe, max_tokens: int) -> Step:
    """A uuid alone is the one request a sound engine refuses."""
    return Step(id=f"{eid}-{role}", role=role, tenant=tenant, length=PROMPT_TOKENS, stream=False,
                expect_served=role == "prime" or probe != "uuid-only", boundary=f"media-{probe}",
                max_tokens=max_tokens, aim=Aim.NONE)


def media_plan(run: Run) -> Plan:
    """Per ordered pair of tenants and per probe, an exchange: the victim's card (prime), the observer's image
    (probe).  Announced before the first is sent, so that the daemon's metrics know its boundaries."""
    plan = Plan(run.target.config.name, [], run_id=run.run_id, letter="md")
    max_tokens = run.config.media_cache.max_tokens
    for victim, observer in pairs(run.target.tenants):
        for probe in PROBES:
            eid = f"{run.run_id}md{len(plan.exchanges) + 1:03d}-{probe}"
            plan.exchanges.append(Exchange(id=eid, victim=victim, observer=observer,
                                           prime=_step(eid, "prime", victim, probe, max_tokens),
                                           probe=_step(eid, "probe", observer, probe, max_tokens)))
    return plan


# The public engine bugs it catches, as the reference engine reproduces each (the bug table: docs/testbed.md).
BUGS = (
    EngineBug("vLLM #55547, #55439, PR #53471", "a client's media uuid the sole key of the processed-media cache: "
              "another tenant's image sent under that uuid, or the uuid alone, is answered with the first tenant's "
              "image", {"media_cache_trusts_uuid": True},
              "the media-cache check: the observer's own card under the victim's uuid, then the uuid alone",
              FindingKind.CROSS_TENANT_ECHO, checks=("media-cache",), releases=(Releases(Engine.VLLM),)),
    EngineBug("LMCache #3301, #4086", "image hashes cut to 16 bits: a different image whose hash agrees in those bits "
              "is answered with the first one's features", {"media_hash_truncated": True},
              "the media-cache check: a card of the observer's whose digest agrees with the victim's in 16 bits, "
              "found by search", FindingKind.CROSS_TENANT_ECHO, checks=("media-cache",)),
    EngineBug("Dynamo PR #8340", "an image hash that leaves the shape out: the same pixel bytes as 448 x 112 and as "
              "112 x 448 share one cache entry", {"media_hash_ignores_shape": True},
              "the media-cache check: the victim's pixel bytes with width and height swapped",
              FindingKind.CROSS_TENANT_ECHO, checks=("media-cache",)),
)


class MediaCacheCheck(Check):
    name = "media-cache"
    about = "another tenant's image read back: a reused media uuid, a uuid alone, a colliding digest, reshaped pixels"
    every = 21_600.0
    bugs = BUGS

    def in_audit(self, config: ProberConfig) -> bool:
        return config.media_cache.audit

    def planned(self, run: Run) -> Planned:
        if not run.target.config.api.openai_routes:
            return Planned.moot_because(f"the {run.target.config.api} API takes no images here")
        settings, tenants = run.config.media_cache, run.target.tenants
        requests = len(pairs(tenants)) * 2 * len(PROBES)
        tokens = requests * (PROMPT_TOKENS + settings.image_tokens)
        return Planned(tokens, requests, tokens / PREFILL_FLOOR + requests * settings.max_tokens / DECODE_FLOOR
                       + len(pairs(tenants)) * settings.search_seconds)

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        """On the chat route (beside a configured completions one): the only one that carries images."""
        ctx = run.target
        route = await ctx.routes.get(Api.CHAT)
        plan = media_plan(run)
        run.on_event(PlanReady(plan))
        sender = _Sender(run, route, await route.counter.count(ASK))
        for exchange in plan.exchanges:
            probe = _probe_of(exchange)
            if sender.result.moot is None and (sender.no_uuids is None or not probe.startswith("uuid")):
                await sender.exchange(exchange, probe)
        if sender.no_uuids is not None:
            sender.result.notes.append(f"uuid probes left out: {sender.no_uuids}")
        return sender.result


def _probe_of(exchange: Exchange) -> Probe:
    return next(p for p in PROBES if exchange.prime.boundary == f"media-{p}")


class _Sender:
    """One run's exchanges, each sent, judged and recorded; what the target showed it takes (images at all, the uuid
    field) decides what is sent next."""

    def __init__(self, run: Run, route: Route, ask_tokens: int) -> None:
        self.run, self.route, self.ask_tokens = run, route, ask_tokens
        self.settings = run.config.media_cache
        self.result = MediaResult(check=MediaCacheCheck.name)
        self.took_images = False  # a card was served: a refusal after it is not "no images"
        self.no_uuids: str | None = None  # why the uuid probes are left out on this target

    async def _card(self, step: Step) -> tuple[Canary, Bitmap]:
        """A fresh canary of the step's tenant, minted for it (in the ledger before the card exists), on a card."""
        canary = await self.run.target.planter.canary(step.tenant, step.id)
        return canary, await asyncio.to_thread(card.draw, canary.text)

    async def exchange(self, exchange: Exchange, probe: Probe) -> None:
        victim_canary, victim_card = await self._card(exchange.prime)
        name = uuid.uuid4().hex if probe.startswith("uuid") else None
        canary: Canary | None = None
        if probe == "collision":
            canary, plain = await self._card(exchange.probe)
            bits = self.settings.hash_bits
            found = await asyncio.to_thread(colliding, plain, cut(digest(victim_card), bits), bits,
                                            self.settings.search_seconds)
            if found is None:
                self.result.notes.append(f"{exchange.id}: no card of {exchange.observer}'s agreed with "
                                         f"{exchange.victim}'s digest in {bits} bits within "
                                         f"{self.settings.search_seconds:g} s: not sent")
                return
            image = Media(data_url(found))
        elif probe == "uuid-reuse":
            canary, mine = await self._card(exchange.probe)
            image = Media(data_url(mine), name)
        elif probe == "uuid-only":
            image = Media(None, name)
        else:
            image = Media(data_url(card.reshaped(victim_card)))
        if await self._send(exchange, exchange.prime, Media(data_url(victim_card), name), victim_canary):
            await self._send(exchange, exchange.probe, image, canary)

    async def _send(self, exchange: Exchange, step: Step, image: Media, canary: Canary | None) -> bool:
        """Whether it was served.  A victim's card refused before any was served, for want of images, makes the
        check moot; refused for its uuid, it leaves the uuid probes out; neither is judged (there is no answer)."""
        ctx, result = self.run.target, self.result
        answer = await ctx.send_as(step.tenant, Prompt(ASK, max_tokens=step.max_tokens, media=(image,)), self.route)
        if step.role == "prime" and not answer.served and answer.error is not None:
            if image.uuid is None and not self.took_images and (why := refuses_images(answer)):
                result.moot = why
                return False
            if image.uuid is not None and answer.refused:
                self.no_uuids = f"the target refuses a media uuid (HTTP {answer.status}: {answer.error.message[:200]})"
                return False
        self.took_images = self.took_images or answer.served
        built = BuiltPrompt(text=ASK, requested=self.ask_tokens, tokens=self.ask_tokens, counted=True,
                            counter=self.route.counter.source, canaries=(canary,) if canary else ())
        judged = await ctx.judge.answer(step, exchange.id, built, answer, check=MediaCacheCheck.name)
        usage = answer.usage.prompt_tokens if answer.usage else None
        result.other_tokens += max(0, (usage or 0) - self.ask_tokens)  # the image's tokens, as the engine counts them
        record(judged, result, self.run.on_event, others=counterpart(exchange, step))
        return answer.served
