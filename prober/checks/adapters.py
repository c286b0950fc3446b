"""Canary adapters: is one tenant's request ever served with another tenant's fine-tune?

Serving many customers' fine-tunes as LoRA adapters on one base model is common, and engines have served an
in-flight request with another user's adapter after a runtime load re-assigned its slot (vLLM #47724), and reused
KV computed under one adapter for a request that selected another, the adapter missing from the prefix-cache key
(vLLM #30931, #42125, #44250; llama.cpp #26207; SGLang #8263) — each an HTTP 200 with "no error, no log, and no
metric".  Where each tenant's adapter on a target is a canary adapter (prober/canaries/adapters.py: tuned to answer
leakprobe's trigger with its tenant's canary), two rounds make that visible:

- own: every tenant asks the trigger `per_tenant` times through its own adapter (a tenant without one through the
  base model), all at once and interleaved, each after a fresh sentence, so that batches mix adapters;
- shared: for each tenant with an adapter in turn, one fresh prompt that fills a whole cache block before the
  trigger, sent first through that adapter, then by every other tenant through its own: where the cache key leaves
  the adapter out, the later requests are served KV computed under the first.

Every answer is scanned: another adapter's canary in it is a `cross_tenant_echo` attributed to that adapter's tenant
(its canary is derived from the deployment key and kept in the ledger before any prompt asks for it).  How many
answers through an adapter carried its own canary says whether the check could see at all.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field, replace

from prober.canaries.adapters import asking
from prober.canaries.filler import load_filler
from prober.capacity.known_bugs import Releases
from prober.checks.base import Check, Run
from prober.checks.bugs import EngineBug
from prober.config.schema import ProberConfig
from prober.domain.errors import PromptError
from prober.domain.evidence import AdapterAsk, adding
from prober.domain.types import Canary, Finding, FindingKind, ProbeContext, Record, Severity
from prober.probing.events import Observed
from prober.probing.plan import Planned
from prober.probing.results import CheckResult, Sight
from prober.prompts import TokenCounter
from prober.targets.api import Engine
from prober.targets.base import Prompt
from prober.targets.result import Completion

BOUNDARY = "adapters"
OWN_TOKENS = 64  # a bound on one trigger after a sentence, with a chat template around it
# A cache block where the engine does not say: vLLM's on the CPU (its GPU blocks of 16 and SGLang's pages of 1 fit
# in it), so that the shared prompt's first block is whole before the trigger whatever the engine.
USUAL_BLOCK = 128
TAIL_TOKENS = 24  # the trigger and a chat template's end after the shared prompt's filler
RESIZES = 4  # countings of the shared prompt to reach its length


@dataclass(frozen=True)
class Ask:
    id: str
    tenant: str
    adapter: str | None  # None: the target's base model
    text: str
    stream: bool
    round: str  # "own" or "shared"
    first: str | None = None  # in the shared round: the tenant whose adapter sent the prompt first


@dataclass(kw_only=True)
class AdaptersResult(CheckResult):
    asked: int = 0
    answered: int = 0  # served answers through an adapter
    own_echoed: int = 0  # of those, answers that carried their adapter's own canary
    foreign: int = 0  # answers that carried another adapter's canary
    seen: list[Observed] = field(default_factory=list)  # what its served answers observed, told once judged

    @property
    def requests(self) -> int:
        return self.asked

    @property
    def sight(self) -> Sight | None:
        """An adapter that never answers its trigger with its canary would not show another's either."""
        return Sight(self.answered, self.own_echoed) if self.answered else None

    def summary(self) -> str:
        return (f"adapters: {self.asked} triggers asked, {self.answered} answered through an adapter, "
                f"{self.own_echoed} with its own canary, {self.foreign} with another's")

    def still_checked(self) -> str | None:
        return None


def block_of(run: Run) -> int:
    page = run.target.capacity.page_size
    return page.value if page else USUAL_BLOCK


# Each tenant's canary adapter, by the name requests select it with: the target's `adapters:` in the bug table's
# rows, and the adapters the tests' reference engine serves.
CANARY_ADAPTERS = {"tenant-a": "adapter-a", "tenant-b": "adapter-b"}
# The public engine bugs it catches, as the reference engine reproduces each (the bug table: docs/testbed.md).
BUGS = (
    EngineBug("vLLM #30931, #42125, #44250; llama.cpp #26207; SGLang #8263", "the LoRA adapter left out of the "
              "prefix-cache key: a request through tenant B's adapter is served the KV computed under tenant A's for "
              "the same prompt, and answers as A's fine-tune", {"lora_missing_from_cache_key": True},
              "the adapters check's shared round: one fresh prompt through every tenant's adapter in turn",
              FindingKind.CROSS_TENANT_ECHO, checks=("adapters",), audit={"adapters": CANARY_ADAPTERS},
              # vLLM 0.31.0 keys the adapter's path; a reload under the same path (#42125, #44250) is still open.
              releases=(Releases(Engine.VLLM), Releases(Engine.LLAMACPP), Releases(Engine.SGLANG))),
    EngineBug("vLLM #47724 (PR #47725)", "activating an adapter (a runtime `add_lora()`) evicted a LoRA slot that an "
              "in-flight request still decoded with: it finished with another tenant's adapter, with no error, log "
              "or metric", {"lora_slot_evicted_in_flight": True},
              "the adapters check's first round: every tenant's trigger through its own adapter, all at once",
              FindingKind.CROSS_TENANT_ECHO, checks=("adapters",), engine={"max_loras": 1},
              audit={"adapters": CANARY_ADAPTERS}, releases=(Releases(Engine.VLLM, fixed_in="0.26.0"),)),
)


class AdaptersCheck(Check):
    name = "adapters"
    about = "each tenant's canary adapter asked its trigger beside the others', and one prompt through every adapter"
    every = 3_600.0
    bugs = BUGS

    def in_audit(self, config: ProberConfig) -> bool:
        return config.adapters.audit

    def planned(self, run: Run) -> Planned:
        settings, tenants = run.config.adapters, run.target.tenants
        adapters = run.target.config.adapters
        if not adapters:
            return Planned.moot_because("no tenant names a canary adapter on this target (`adapters:`)")
        own = len(tenants) * settings.per_tenant
        shared = len(adapters) * len(tenants)
        tokens = own * OWN_TOKENS + shared * (block_of(run) + 2 * TAIL_TOKENS)
        return Planned.of(tokens, own + shared, settings.max_tokens * (1 + shared))

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        ctx, settings = run.target, run.config.adapters
        adapters = ctx.config.adapters
        canaries = {tenant: await asyncio.to_thread(ctx.wiring.minter.adapter, tenant, adapter)
                    for tenant, adapter in adapters.items()}
        ctx.wiring.scanner.add(list(canaries.values()))
        result = AdaptersResult(check=self.name)
        streaming = run.config.audit.streaming
        filler = load_filler("en")
        asks: list[Ask] = []
        for _ in range(settings.per_tenant):
            for tenant in ctx.tenants:
                stream = streaming == "stream" or (streaming == "both" and len(asks) % 2 == 1)
                sentence = filler.text(1, seed=secrets.randbits(30))
                asks.append(Ask(f"{run.run_id}ad{len(asks) + 1:03d}", tenant, adapters.get(tenant), asking(sentence),
                                stream, "own"))
        answers = await asyncio.gather(*(self._send(run, ask, settings.max_tokens) for ask in asks))
        for ask, answer in zip(asks, answers, strict=True):
            result.extra += await self._judge(run, ask, answer, canaries, result)
        route = await ctx.route()
        for first in adapters:
            try:
                text = await shared_prompt(route.counter, block_of(run) + TAIL_TOKENS)
            except PromptError as exc:
                result.errors.append(f"the shared prompt through {adapters[first]}: {exc}")
                continue
            order = [first, *(t for t in ctx.tenants if t != first)]
            for n, tenant in enumerate(order):
                ask = Ask(f"{run.run_id}ad{len(asks) + 1:03d}", tenant, adapters.get(tenant), text,
                          streaming == "stream", "shared", first=None if n == 0 else first)
                asks.append(ask)
                result.extra += await self._judge(run, ask, await self._send(run, ask, settings.max_tokens),
                                                  canaries, result)
        result.asked = len(asks)
        result.extra = await ctx.judge.persist(result.extra, None, run.on_event, check=self.name)
        for seen in result.seen:
            run.on_event(seen)
        return result

    @staticmethod
    async def _send(run: Run, ask: Ask, max_tokens: int) -> Completion:
        return await run.target.send_as(ask.tenant, Prompt(ask.text, max_tokens=max_tokens, stream=ask.stream,
                                                           model=ask.adapter))

    @staticmethod
    async def _judge(run: Run, ask: Ask, answer: Completion, canaries: dict[str, Canary],
                     result: AdaptersResult) -> list[Finding]:
        """Its findings (not yet durable); what it shows of the check's sight, counted into `result`."""
        through = ask.adapter or "the base model"
        result.other_tokens += (answer.usage.prompt_tokens or 0) if answer.usage else 0
        if not answer.served:
            result.errors.append(f"{ask.id} ({ask.tenant} through {through}): "
                                 f"{answer.error or f'HTTP {answer.status}'}")
            if not answer.full_text:
                return []
        elif ask.adapter is not None:
            result.answered += 1
        scanner = run.target.wiring.scanner
        scanned = await asyncio.to_thread(scanner.scan, Record(ask.id, ask.tenant, answer.full_text, ask.text))
        own = canaries.get(ask.tenant)
        if answer.served and own is not None and any(h.canary and h.canary.id == own.id for h in scanned.own_echoes):
            result.own_echoed += 1
        asked = AdapterAsk(ask.round, ask.adapter, answer.streamed, ask.first)
        where = ProbeContext(answer.usage.prompt_tokens if answer.usage else None, BOUNDARY, answer.status)
        if scanned.crossed:
            result.foreign += 1
        if answer.served:  # scanned for every adapter's canary
            result.seen.append(Observed(AdaptersCheck.name, BOUNDARY, ask.tenant, None,
                                        faulted=any(f.severity > Severity.INFO for f in scanned.findings)))
        copy = (answer.from_cache,) if answer.from_cache else ()  # a cache in front served it: an echo all the same
        return [replace(f, probe_id=f.probe_id or ask.id, context=where, evidence=adding(f.evidence, asked, *copy))
                for f in scanned.findings]


async def shared_prompt(counter: TokenCounter, tokens: int) -> str:
    """A fresh prompt of at least `tokens` tokens as the route counts them, the trigger at its end (raises
    PromptError where its tokens cannot be counted)."""
    filler, seed = load_filler("en"), secrets.randbits(30)
    chars = tokens * 4
    for _ in range(RESIZES):
        text = asking(filler.text(chars, seed=seed))
        counted = await counter.count(text)
        if counted >= tokens:
            return text
        chars = int(chars * tokens / max(counted, 1) * 1.1) + 40
    raise PromptError(f"{RESIZES} fillers of growing length stayed under {tokens} tokens")
