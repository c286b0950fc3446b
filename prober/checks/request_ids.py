"""Request-ID collisions: sets of concurrent requests, one or more from every tenant, each set carrying one client
request ID, each request asking for its own canary back; every answer is checked for its own and anyone else's.

Engines and routers key the requests in flight by an ID, and take the client's where it sends one: vLLM the
`X-Request-Id` header or the body's `request_id`, SGLang the body's `rid`, routers either, or the trace id of a
W3C `traceparent` (Dynamo used it as SGLang's rid, ai-dynamo/dynamo #8601).  Two requests in flight under one ID
have corrupted each other's state (SGLang PR #19035: "potential data corruptions"; vLLM #10583), and a client
that sent every request under one ID had "one user's tool response delivered to a different conversation's
request" (modelcontextprotocol/python-sdk #3060).  Clients of a shared endpoint choose their IDs, so one tenant
can send another's; here two tenants send the same fresh one.  Another tenant's canary in an answer is a
`cross_tenant_echo`, its victim the canary's owner, and the exchange it names is the shared ID.

The ID travels in the `X-Request-Id` header and a `traceparent` derived from it (unknown headers are ignored
everywhere), and in the body fields the engine takes (`request_ids.fields`; by default the engine's own where the
survey knows it, and every engine's, vLLM's `request_id` and SGLang's `rid`, where it does not: a gateway that hides
the engine's introspection often forwards only the body, and vLLM and SGLang ignore each other's field; an API that
refuses a field it does not know needs `fields: []`).  Whether the
target took the ID is read back from its answers (vLLM and SGLang name an answer by its request's ID): one that
named none by it names requests itself, so a collision can only happen in front of it (a gateway, a router).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from secrets import token_hex

from prober.capacity.known_bugs import Releases
from prober.checks.base import Check, Run
from prober.checks.bugs import EngineBug
from prober.checks.shapes import shaped
from prober.config.schema import ProberConfig
from prober.config.sections import RequestIdSettings
from prober.domain.types import FindingKind
from prober.probing.context import record
from prober.probing.plan import Aim, Plan, Planned, Step
from prober.probing.planting import ASKED
from prober.probing.results import CheckResult
from prober.prompts.shape import Layout
from prober.targets.api import Engine
from prober.targets.request_ids import RequestId

BOUNDARY = "request-id"
ENGINE_FIELDS = {Engine.VLLM: ("request_id",), Engine.SGLANG: ("rid",)}  # the body fields each engine takes
ANY_ENGINE = tuple(dict.fromkeys(f for fields in ENGINE_FIELDS.values() for f in fields))  # for an unknown one


@dataclass(kw_only=True)
class RequestIdResult(CheckResult):
    fields: tuple[str, ...] = ()  # body fields that carried the ID beside the headers
    named: int = 0  # answers the target named by their set's ID: it took the client's ID as the request's

    @property
    def answered(self) -> int:
        """Its own requests' served answers (the probe-shape controls it may have run first are not its own)."""
        return sum(1 for s in self.steps if s.step.boundary == BOUNDARY and s.answer.served)

    def summary(self) -> str:
        sent = sum(1 for s in self.steps if s.step.boundary == BOUNDARY)
        return (f"request IDs: {sent} requests in sets sharing an ID (headers{''.join(f', {f}' for f in self.fields)})"
                f", {self.answered} answered, {self.named} named by the shared ID, {len(self.findings)} findings")


def fields_for(settings: RequestIdSettings, engine: Engine | None) -> tuple[str, ...]:
    """The body fields that carry the ID: those configured, else the engine's own, and every engine's where the
    engine is not known (behind a gateway it may be either, and the gateway may drop the headers)."""
    if settings.fields is not None:
        return settings.fields
    return ENGINE_FIELDS.get(engine, ()) if engine is not None else ANY_ENGINE


# The public engine bugs it catches, as the reference engine reproduces each (the bug table: docs/testbed.md).
BUGS = (
    EngineBug("SGLang PR #19035, vLLM #10583, modelcontextprotocol/python-sdk #3060", "requests in flight kept "
              "under the ID the client sent: two tenants' requests under one ID share one entry, and one of them is "
              "handed the other's answer", {"keys_requests_by_client_id": True},
              "the request-ID check: every tenant's requests at once under one client request ID (header and body "
              "field), each answer checked for the others' canaries", FindingKind.CROSS_TENANT_ECHO,
              checks=("request-ids",), engine={"decode_ms_per_token": 1},
              # SGLang refuses a duplicate rid from 0.5.10; vLLM suffixes the client's ID from 0.14.0 (PR #27987).
              releases=(Releases(Engine.SGLANG, fixed_in="0.5.10"), Releases(Engine.VLLM, fixed_in="0.14.0"))),
)


class RequestIdsCheck(Check):
    name = "request-ids"
    about = "concurrent requests of every tenant under one client request ID: each answer carries only its own"
    every = 900.0  # a few short requests: cheap enough for every quarter hour
    bugs = BUGS

    def in_audit(self, config: ProberConfig) -> bool:
        return config.request_ids.audit

    def planned(self, run: Run) -> Planned:
        settings = run.config.request_ids
        requests = settings.groups * len(run.target.tenants) * settings.per_tenant
        return Planned.of(requests * settings.tokens, requests, requests * settings.max_tokens)

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        """Each set's prompts built first (every one led by a fresh nonce, so that none shares a prefix with
        another), then sent at once, tenants interleaved, streamed as the audit streams."""
        ctx, settings = run.target, run.config.request_ids
        result = RequestIdResult(check=self.name, fields=fields_for(settings, ctx.capacity.engine))
        await shaped(run, result)
        route, page = await ctx.route(), ctx.surveyed.page if ctx.surveyed else None
        cue = ctx.shape is not None and ctx.shape.chosen.layout is Layout.CUE
        plan = Plan(ctx.config.name, [], run_id=run.run_id, letter="i")
        streaming = run.config.audit.streaming
        for group in range(1, settings.groups + 1):
            shared = RequestId(f"leakprobe-{run.run_id}{group:02d}-{token_hex(6)}", result.fields)
            steps = [Step(id=f"{run.run_id}ri{group:02d}-{tenant}-{n}", role="probe", tenant=tenant,
                          length=settings.tokens, max_tokens=settings.max_tokens, expect_served=True,
                          boundary=BOUNDARY, aim=Aim.NONE,
                          stream=streaming == "stream" or (streaming == "both" and (group + i) % 2 == 1))
                     for n in range(1, settings.per_tenant + 1) for i, tenant in enumerate(ctx.tenants)]
            built = [await ctx.planter.prompt(step, ASKED["quote"], route, plan, page=page, cue=cue, lead=cue,
                                              nonce=token_hex(6)) for step in steps]
            sent = await asyncio.gather(*(ctx.send(step, prompt, route, request_id=shared)
                                          for step, prompt in zip(steps, built, strict=True)))
            for step, prompt, (answer, before) in zip(steps, built, sent, strict=True):
                result.named += shared.named_by(answer.answer_id, answer.headers)
                judged = await ctx.judged(step, shared.value, prompt, answer, route, check=self.name, before=before)
                record(judged, result, run.on_event)
        if result.answered and not result.named:
            result.notes.append(f"request IDs: the target named none of {result.answered} answers by the client's ID: "
                                "it names requests itself, so only a gateway or router in front of it could mix "
                                "them up")
        if ctx.capacity.engine is None and settings.fields is None:
            result.notes.append(f"request IDs: the engine is not known, so every engine's body field carried the ID "
                                f"({', '.join(result.fields)}) beside the X-Request-Id and traceparent headers; an API "
                                "that refuses a field it does not know needs `request_ids.fields: []`")
        return result
