"""The isolation checks a target runner runs beside its plans: the timing check of prefix-cache isolation, the
idle-slot check and the cross-talk burst (each in its own module; this wires them to the runner's route,
planting, judging and engine counters)."""

from __future__ import annotations

import asyncio
from secrets import token_hex
from typing import Protocol

from prober.campaign.counters import CounterEvidence
from prober.campaign.crosstalk import CrosstalkResult, run_burst
from prober.campaign.events import BurstDone, FindingRecorded, Listener, StepDone, TimingDone, ignore
from prober.campaign.judging import Judge
from prober.campaign.plan import Plan, Step, Streaming, acceptance_limit
from prober.campaign.planting import ASKED, PRIME_INSTRUCTION, Planter
from prober.campaign.results import SlotCheck, StepResult
from prober.campaign.routes import Route
from prober.campaign.slots import check_idle_slots, width_of
from prober.campaign.survey import PreflightResult
from prober.campaign.timing import TimingResult, check_timing
from prober.campaign.wiring import Wiring
from prober.config import CrosstalkSettings, SlotSettings, TargetConfig, TimingSettings
from prober.detect.scanner import ScanResult
from prober.prompts import BuiltPrompt
from prober.targets.base import Prompt
from prober.targets.result import Completion
from prober.targets.telemetry import EngineTelemetry
from prober.types import Finding, Record


class Runner(Protocol):
    """What the checks take of a target runner (prober/campaign/runner.py)."""

    config: TargetConfig
    wiring: Wiring
    planter: Planter
    judge: Judge
    surveyed: PreflightResult | None
    salted: frozenset[str]
    telemetry: EngineTelemetry | None

    @property
    def tenants(self) -> list[str]: ...

    async def route(self) -> Route: ...

    async def send_as(self, tenant: str, prompt: Prompt, route: Route | None = None) -> Completion: ...

    async def send_and_check(self, step: Step, built: BuiltPrompt, route: Route) -> StepResult: ...

    async def decide_counters(self, counted: CounterEvidence, on_event: Listener) -> list[Finding]: ...


class Isolation:
    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    async def timing(self, settings: TimingSettings, on_event: Listener = ignore, *, run_id: str = "") -> TimingResult:
        """`cross_tenant_cache_timing` over every ordered tenant pair (prober/campaign/timing.py)."""
        runner = self.runner
        refused_from = acceptance_limit(runner.surveyed.capacity) if runner.surveyed else None
        counter = (await runner.route()).builder.counter
        result = await check_timing(runner.send_as, counter, runner.tenants, settings, run_id=run_id,
                                    salted=runner.salted, telemetry=runner.telemetry,
                                    longest=refused_from - 1 if refused_from else None)
        result.findings = await runner.judge.persist(result.findings, None, on_event)
        on_event(TimingDone(result))
        return result

    async def crosstalk(self, settings: CrosstalkSettings, on_event: Listener = ignore, *,
                        streaming: Streaming = "both", run_id: str = "") -> CrosstalkResult:
        """The cross-talk burst (prober/campaign/crosstalk.py): its canaries minted like any other."""
        runner = self.runner
        async def scan(record: Record) -> ScanResult:
            return await asyncio.to_thread(runner.wiring.scanner.scan, record)

        counted = CounterEvidence()
        result = await run_burst(runner.send_as, runner.planter.canary, scan, runner.tenants, settings,
                                 streaming=streaming, run_id=run_id, telemetry=runner.telemetry, counted=counted)
        result.findings = await runner.judge.persist(result.findings, None, on_event)
        result.findings += await runner.decide_counters(counted, on_event)
        on_event(BurstDone(result))
        return result

    async def idle_slots(self, settings: SlotSettings, on_event: Listener = ignore, *,
                         run_id: str = "") -> SlotCheck | None:
        """The idle-slot check (prober/campaign/slots.py), where the target has slots: every prompt led by a fresh
        nonce, so that none shares a prefix with anything a slot holds (the victim's take a slot each)."""
        runner = self.runner
        width = width_of(settings, runner.surveyed.capacity) if runner.surveyed else None
        if width is None:
            return None
        route, page = await runner.route(), runner.surveyed.page if runner.surveyed else None
        plan = Plan(runner.config.name, [], run_id=run_id)

        async def run(step: Step) -> StepResult:
            ask = ASKED["quote"] if step.role == "probe" else PRIME_INSTRUCTION
            built = await runner.planter.prompt(step, ask, route, plan, page=page, cue=False,
                                                nonce=token_hex(6))
            result = await runner.send_and_check(step, built, route)
            on_event(StepDone(result))
            for finding in result.findings:
                on_event(FindingRecorded(finding))
            return result

        return await check_idle_slots(run, runner.tenants, settings, width=width, run_id=run_id)
