"""Prompts sent as embeddings: is one tenant's embeds prompt answered from another's cached KV?

vLLM takes a completions prompt as embeddings (`--enable-prompt-embeds`; `prompt_embeds`, #42119, PR #42172) and
gives it placeholder token ids, one a row.  Its prefix cache hashed those ids and left the embeddings out of the
block key (#56655, fixed by PR #56656), so two different embeds prompts of one length share every block: the second
is answered from the first's KV.  For each ordered pair of tenants the victim sends a prompt that asks for the code
word, its own fresh canary, as embeddings; the observer then sends its own prompt of the same length the same way.
The victim's canary in the observer's answer is a `cross_tenant_echo` (and, under that bug, in any later embeds
prompt's answer: placeholder pages chain alike, so every such prompt shares those of the one before it).  The
prompts go through the input-embedding table the target's `prompt_embeds` names (prober/input_embeds); the check is
moot where it names none, or where the target refuses the victim's first prompt as one it takes no embeddings in
(vLLM without the flag: a 400).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from prober.capacity.known_bugs import Releases
from prober.checks.base import Check, Run
from prober.checks.bugs import EngineBug
from prober.config.sections import Strict
from prober.domain.errors import PlanError
from prober.domain.types import Canary, FindingKind
from prober.input_embeds import InputTable, ModelTable, ReferenceTable, encode
from prober.probing.context import record
from prober.probing.events import PlanReady
from prober.probing.exchanges import counterpart
from prober.probing.plan import Aim, Exchange, Plan, Planned, Step, pairs
from prober.probing.results import CheckResult
from prober.probing.routes import Route
from prober.prompts import BuiltPrompt
from prober.targets.api import Api, Engine
from prober.targets.base import Prompt
from prober.targets.result import Completion

BOUNDARY = "prompt-embeds"
ASK = "Repeat the code word exactly."
# Words after the code, repeated up to the prompt's length, so that the code lies in whole blocks a cache shares.
FILLER = " The code word above is the only thing asked for; the words that follow it only fill the prompt out."
CUE = "\nThe code word is"  # last: a small real model then says the code (padding after it, it loops instead)
# How an engine that takes no embeddings says so (vLLM without the flag: "You must set `--enable-prompt-embeds`").
NO_EMBEDS = re.compile(r"enable-prompt-embeds|prompt_embeds|prompt embed", re.IGNORECASE)


class PromptEmbedsSettings(Strict):
    """Each tenant's canary sent as prompt embeddings, then another tenant's prompt of the same length."""

    audit: bool = True
    """Run the prompt-embeds check in `leakprobe audit` (moot where the target's `prompt_embeds` names no table)."""
    tokens: int = Field(default=96, ge=32, le=4096)
    """Prompt length, in rows: past the engine's first whole block or more, so that a cache keyed without the
    embeddings shares the code's (vLLM's blocks: 16 tokens on GPUs, 128 in its CPU build: give 300 there)."""
    max_tokens: int = Field(default=48, ge=8, le=1024)
    """Completion tokens per request (enough to read a canary back)."""


@cache
def table_of(name: str) -> InputTable:
    """The input-embedding table a target's `prompt_embeds` names: `reference`, or a model folder (kept: a real
    model's table is loaded once).  Raises PlanError where the folder is no model's."""
    if name == "reference":
        # The reference engine's own tokenizer, imported only here: nothing else of the checks needs the testbed.
        from prober.testbed.tokenizer import encode

        return ReferenceTable(encode)
    try:
        return ModelTable(Path(name))
    except ValueError as exc:
        raise PlanError(f"prompt_embeds: {exc}") from None


def rows_for(table: InputTable, head: str, length: int) -> np.ndarray:
    """The rows of `head`, filler and the cue, `length` of them: filler repeated up to it, then cut, or padded with
    the row of a line break where the cue begins, so that both tenants' prompts have one length and end alike."""
    text = head
    while len(table.rows(text + FILLER + CUE)) <= length:
        text += FILLER
    rows, split = table.rows(text + CUE), len(table.rows(text))
    split = min(split, len(rows))
    over = max(0, len(rows) - length)
    pad = np.repeat(table.rows("\n")[-1:], max(0, length - len(rows)), axis=0)
    return np.concatenate([rows[: split - over], pad, rows[split:]])


def refuses_embeds(answer: Completion) -> str | None:
    """Why a target's answer to a prompt as embeddings says it takes none (None: it does not say so)."""
    error = answer.error
    if answer.served or error is None or error.status is None or not 400 <= error.status < 500:
        return None
    said = NO_EMBEDS.search(error.message) or error.status in (404, 405, 415, 422)
    return f"the target takes no prompt embeddings (HTTP {error.status}: {error.message[:200]})" if said else None


# The public engine bugs it catches, as the reference engine reproduces each (the bug table: docs/testbed.md).
BUGS = (
    EngineBug("vLLM #56655, PR #56656", "prompt embeddings left out of the prefix-cache block key (vLLM: a mixed "
              "prompt's mask): another tenant's embeds prompt of the same length is answered from the first's KV",
              {"prompt_embeds_missing_from_cache_key": True, "shared_prefix_cache": True},
              "the prompt-embeds check: the victim's canary prompt as embeddings, then the observer's own of the "
              "same length", FindingKind.CROSS_TENANT_ECHO, checks=(BOUNDARY,),
              engine={"enable_prompt_embeds": True}, audit={"prompt_embeds": "reference"},
              releases=(Releases(Engine.VLLM),)),
)


class PromptEmbedsCheck(Check):
    name = BOUNDARY
    about = "each tenant's canary sent as prompt embeddings, then another's prompt of one length: only its own back"
    every = 21_600.0
    docs = "checks.md"
    settings = PromptEmbedsSettings
    bugs = BUGS

    def planned(self, run: Run) -> Planned:
        cfg = run.target.config
        if cfg.prompt_embeds is None:
            return Planned.moot_because("the target's `prompt_embeds` names no input-embedding table")
        table_of(cfg.prompt_embeds)  # a folder that is no model's: not planned, and said why
        if not cfg.api.openai_routes:
            return Planned.moot_because(f"the {cfg.api} API takes no prompt embeddings")
        settings = run.config.section(self.name, PromptEmbedsSettings)
        requests = 2 * len(pairs(run.target.tenants))
        return Planned.of(requests * settings.tokens, requests, requests * settings.max_tokens)

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        """On the completions route (beside a configured chat one): the one that carries embeddings."""
        settings = run.config.section(self.name, PromptEmbedsSettings)
        table = table_of(run.target.config.prompt_embeds or "")
        route = await run.target.routes.get(Api.COMPLETIONS)
        plan = Plan(run.target.config.name, [], run_id=run.run_id, letter="pe")
        for victim, observer in pairs(run.target.tenants):
            eid = f"{run.run_id}pe{len(plan.exchanges) + 1:03d}"
            plan.exchanges.append(Exchange(id=eid, victim=victim, observer=observer,
                                           prime=_step(eid, "prime", victim, settings),
                                           probe=_step(eid, "probe", observer, settings)))
        run.on_event(PlanReady(plan))
        result = CheckResult(check=self.name)
        for exchange in plan.exchanges:
            if result.moot is None and await self._send(run, table, route, exchange, exchange.prime, result):
                await self._send(run, table, route, exchange, exchange.probe, result)
        return result

    async def _send(self, run: Run, table: InputTable, route: Route, exchange: Exchange, step: Step,
                    result: CheckResult) -> bool:
        """Whether it was served.  A victim's prompt refused for want of embeddings makes the check moot."""
        ctx = run.target
        canary: Canary = await ctx.planter.canary(step.tenant, step.id)
        text = f"{ASK} The code word is {canary.text}.{FILLER}"
        rows = rows_for(table, text, step.length)
        text += CUE
        answer = await ctx.send_as(step.tenant, Prompt(text, max_tokens=step.max_tokens, embeds=encode(rows)), route)
        if step.role == "prime" and not result.steps and (why := refuses_embeds(answer)):
            result.moot = why
            return False
        built = BuiltPrompt(text=text, requested=step.length, tokens=step.length, counted=True,
                            counter=f"input-embedding table {ctx.config.prompt_embeds}", canaries=(canary,))
        judged = await ctx.judge.answer(step, exchange.id, built, answer, check=self.name)
        record(judged, result, run.on_event, others=counterpart(exchange, step))
        return answer.served


def _step(eid: str, role: Literal["prime", "probe"], tenant: str, settings: PromptEmbedsSettings) -> Step:
    return Step(id=f"{eid}-{role}", role=role, tenant=tenant,
                length=settings.tokens, stream=False, expect_served=True, boundary=BOUNDARY,
                max_tokens=settings.max_tokens, aim=Aim.NONE)
