"""Cross-talk under batching: a burst of concurrent short requests from every tenant, each asking for its
own canary back, and every answer checked for anyone else's.

Engines have handed one request's answer to another when requests run together (vLLM #13408 and #9910;
llama.cpp #25992 with `-np 4 --kv-unified`: 3 of 36 replies were other requests').  That class needs no
boundary and no long prompt, only requests that share a batch, so this check is cheap enough for every
daemon cycle: each request carries one fresh canary of its tenant (persisted before it is sent), asks for
it back, and the scanner reads every answer.  Another tenant's canary is a `cross_tenant_echo` like any
other; another request's canary of the *same* tenant is a `cross_request_echo` (two users of one tenant are
often two customers).  How many answers carried their own canary says whether the check could see at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from prometheus_client import CollectorRegistry, Counter

from prober.capacity.known_bugs import Releases
from prober.checks.base import Check, ResultMetrics, Run
from prober.checks.bugs import EngineBug
from prober.checks.timing import Send
from prober.config.schema import ProberConfig
from prober.config.sections import CrosstalkSettings
from prober.detect.scanner import ScanResult
from prober.domain.evidence import Burst
from prober.domain.types import Canary, Finding, FindingKind, ProbeContext, Record, Severity
from prober.probing.counters import CounterEvidence
from prober.probing.events import Observed
from prober.probing.plan import Planned, Streaming
from prober.probing.results import CheckResult, Sight
from prober.targets.api import Engine
from prober.targets.base import Prompt
from prober.targets.bounds import DECODE_FLOOR, PREFILL_FLOOR
from prober.targets.result import Completion
from prober.targets.telemetry import EngineTelemetry, window

ASK = "The code word is {code}. Repeat the code word exactly.\nThe code word is"
BOUNDARY = "crosstalk"  # where its findings and its re-checks are, for incidents
# A bound on one request's prompt tokens, for budgets: measured 47 with completions, 55 with Gemma's chat template.
PROMPT_TOKENS = 64

Mint = Callable[[str, str], Awaitable[Canary]]  # (tenant, request id) -> a canary, persisted and indexed
Scan = Callable[[Record], Awaitable[ScanResult]]


@dataclass(frozen=True)
class BurstRequest:
    id: str
    tenant: str
    canary: Canary
    stream: bool


@dataclass(kw_only=True)
class CrosstalkResult(CheckResult):
    requests: int = 0
    answered: int = 0  # served answers
    own_echoed: int = 0  # answers that carried their own canary: the check can see what comes back
    foreign: int = 0  # answers that carried another request's canary (any tenant)
    seen: list[Observed] = field(default_factory=list)  # what its served answers observed, told once judged

    @property
    def sight(self) -> Sight | None:
        """Its own requests ask for their code back: a swapped answer shows only where they do."""
        return Sight(self.answered, self.own_echoed) if self.answered else None

    def summary(self) -> str:
        return (f"cross-talk: {self.requests} concurrent requests, {self.answered} answered, {self.own_echoed} with "
                f"their own code, {self.foreign} with another's")

    def still_checked(self) -> str | None:
        return None


def planned_tokens(settings: CrosstalkSettings, tenants: Sequence[str]) -> int:
    return len(tenants) * settings.per_tenant * PROMPT_TOKENS


async def run_burst(send: Send, mint: Mint, scan: Scan, tenants: Sequence[str], settings: CrosstalkSettings, *,
                    streaming: Streaming = "both", run_id: str = "", telemetry: EngineTelemetry | None = None,
                    counted: CounterEvidence | None = None) -> CrosstalkResult:
    """All requests at once, tenants interleaved (so batches mix them), streamed as the audit streams (half of
    them for "both").  The engine's counters around the burst go to `counted`, named on its first served answer."""
    requests: list[BurstRequest] = []
    for _ in range(settings.per_tenant):
        for tenant in tenants:
            rid = f"{run_id}ct{len(requests) + 1:03d}"
            stream = streaming == "stream" or (streaming == "both" and len(requests) % 2 == 1)
            requests.append(BurstRequest(rid, tenant, await mint(tenant, rid), stream=stream))
    async with window(telemetry, len(requests)) as engine:
        answers = await asyncio.gather(*(send(r.tenant, Prompt(ASK.format(code=r.canary.text),
                                                               max_tokens=settings.max_tokens, stream=r.stream))
                                         for r in requests))
    result = CrosstalkResult(check=CrosstalkCheck.name, requests=len(requests))
    served = [(r, a) for r, a in zip(requests, answers, strict=True) if a.served]
    read = False  # the engine's counters around the burst are evidence
    if served and counted is not None:
        first, answer = served[0]
        tokens = answer.usage.prompt_tokens if answer.usage else None
        read = counted.add(engine, request=first.id, tenant=first.tenant,
                           context=ProbeContext(tokens, BOUNDARY, answer.status), unserved=len(requests) - len(served),
                           retried=any(a.retried for a in answers))
    for request, answer in zip(requests, answers, strict=True):
        result.extra += await _judge(request, answer, scan, result, read)
    if (counters := engine.evidence()) is not None:
        result.extra = [f.adding(counters) for f in result.extra]
    return result


async def _judge(request: BurstRequest, answer: Completion, scan: Scan, result: CrosstalkResult,
                 counted: bool) -> list[Finding]:
    result.other_tokens += (answer.usage.prompt_tokens or 0) if answer.usage else 0
    if not answer.served:
        result.errors.append(f"{request.id} ({request.tenant}): {answer.error or f'HTTP {answer.status}'}")
        if not answer.full_text:
            return []
    else:
        result.answered += 1
    scanned = await scan(Record(request.id, request.tenant, answer.full_text, ASK.format(code=request.canary.text)))
    burst = Burst(answer.streamed, request.canary.id)
    where = ProbeContext(boundary=BOUNDARY, status=answer.status)
    stored = answer.from_cache  # a copy a cache in front served: another request's answer, but not the engine's mix-up
    findings = [replace(f.adding(burst, *([stored] if stored else [])), probe_id=f.probe_id or request.id,
                        context=where) for f in scanned.findings]
    own = [hit for hit in scanned.own_echoes if hit.canary is not None]
    if any(hit.canary.id == request.canary.id for hit in own if hit.canary):
        result.own_echoed += 1
    strays = [hit for hit in own if hit.canary and hit.canary.id != request.canary.id and stored is None]
    for hit in strays:
        assert hit.canary is not None
        findings.append(Finding(
            record_id=request.id, kind=FindingKind.CROSS_REQUEST_ECHO, detector=hit.detector, severity=Severity.HIGH,
            score=hit.score, observer_tenant=request.tenant, victim_tenant=request.tenant, canary_id=hit.canary.id,
            probe_id=hit.canary.probe_id or request.id, start=hit.start, end=hit.end, context=where,
            excerpt=f"the answer to {request.id} carries the canary of {hit.canary.probe_id}, another request of "
                    f"{request.tenant} in the same burst: answers were mixed between concurrent requests",
            evidence=(replace(burst, other_request=hit.canary.probe_id),)))
    if strays or scanned.crossed:
        result.foreign += 1
    if answer.served:  # scanned for every canary of the burst, its own tenant's other requests' too
        result.seen.append(Observed(CrosstalkCheck.name, BOUNDARY, request.tenant, None,
                                    faulted=any(f.severity > Severity.INFO for f in findings), counted=counted))
    return findings


# The public engine bugs it catches, as the reference engine reproduces each (the bug table: docs/testbed.md).
BUGS = (
    EngineBug("SGLang #24527, #35049, #38961", "decode freed KV pages while a write to them was in flight: the next "
              "request held the first one's KV, with no error anywhere", {"frees_pages_while_written": True},
              "the cross-talk burst: every tenant's short requests at once, each answer checked for the others' "
              "canaries", FindingKind.CROSS_TENANT_ECHO, checks=("crosstalk",),
              # 0.5.21 defers the release by default (#35049), which #38961 (open) says the common case defeats.
              releases=(Releases(Engine.SGLANG),)),
)


class CrosstalkCheck(Check):
    name = "crosstalk"
    about = "a burst of concurrent short requests of every tenant, each asking for its own code back"
    every = 300.0
    bugs = BUGS

    def in_audit(self, config: ProberConfig) -> bool:
        return config.crosstalk.audit

    def metrics(self, registry: CollectorRegistry) -> BurstMetrics:
        return BurstMetrics(registry)

    def planned(self, run: Run) -> Planned:
        settings, tenants = run.config.crosstalk, run.target.tenants
        requests = len(tenants) * settings.per_tenant
        return Planned(planned_tokens(settings, tenants), requests,
                       planned_tokens(settings, tenants) / PREFILL_FLOOR + settings.max_tokens / DECODE_FLOOR)

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        """Its canaries minted like any other; the engine's counters around the burst decided like a plan's."""
        ctx = run.target

        async def scan(record: Record) -> ScanResult:
            return await asyncio.to_thread(ctx.wiring.scanner.scan, record)

        counted = CounterEvidence()
        result = await run_burst(ctx.send_as, ctx.planter.canary, scan, ctx.tenants, run.config.crosstalk,
                                 streaming=run.config.audit.streaming, run_id=run.run_id, telemetry=ctx.telemetry,
                                 counted=counted)
        result.extra = await ctx.judge.persist(result.extra, None, run.on_event, check=self.name)
        result.extra += await ctx.decide_counters(counted, run.on_event, check=self.name)
        result.errors += counted.undecided
        for seen in result.seen:
            run.on_event(seen)
        return result


class BurstMetrics(ResultMetrics):
    """The bursts' answers as the daemon counts them: own canary back, another's, none."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.answers = Counter("leakprobe_crosstalk_answers", "Answers of the cross-talk bursts: own (its own canary "
                               "came back), foreign (another request's canary), unanswered.", ["target", "outcome"],
                               registry=registry)
        self.series = [self.answers]

    def observe(self, target: str, result: CheckResult) -> None:
        if isinstance(result, CrosstalkResult):
            for outcome, count in (("own", result.own_echoed), ("foreign", result.foreign),
                                   ("unanswered", result.requests - result.answered)):
                self.answers.labels(target, outcome).inc(count)
