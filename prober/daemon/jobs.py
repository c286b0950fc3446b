"""The daemon's jobs for one target, on one runner (one open transport, one survey, one prompt-length cache)
that the jobs share until a reload retires it.

- `preflight`: capacity survey and verdicts; sends no generation request.
- `sentinel`: everyday-sized canary prompts from each tenant in turn, every answer scanned.
- `campaign`: the boundary campaign of `leakprobe audit`.
- `timing`: the timing check of prefix-cache isolation (prober/campaign/timing.py).
- `crosstalk`: a burst of concurrent short requests of every tenant (prober/campaign/crosstalk.py).

Each returns a `JobOutcome`; what it says goes to the metrics, the log and `/status`.  Each runs under a deadline
of its own, derived like an audit's (prober/campaign/deadlines.py): a target that never finishes its answers ends
the job there, and the job's next run and the other targets' jobs keep their slots.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import StrEnum

from prober.campaign import TargetReport, TargetRunner, crosstalk, sentinel_plan, shapes, timing
from prober.campaign.deadlines import (
    DEADLINE_BASE_S,
    SURVEY_ALLOWANCE_S,
    crosstalk_seconds,
    plan_seconds,
    shape_seconds,
    timing_seconds,
)
from prober.campaign.events import Listener, PlanReady
from prober.campaign.plan import Plan
from prober.campaign.wiring import Wiring
from prober.config import ProberConfig, TargetConfig
from prober.daemon.budget import TokenBudget
from prober.daemon.observed import ObservedTransport, OnExchange
from prober.errors import LedgerError, PlanError, PromptError, TargetUnusable
from prober.targets.bounds import deadline_passed, run_deadline


class Job(StrEnum):
    PREFLIGHT = "preflight"
    SENTINEL = "sentinel"
    CAMPAIGN = "campaign"
    TIMING = "timing"
    CROSSTALK = "crosstalk"


class Failure(StrEnum):
    """Why a job that started did not complete (`leakprobe_job_failures_total{reason}`)."""

    UNUSABLE = "unusable"  # the target cannot be probed: unreachable, a credential refused
    PLAN = "plan"  # no plan fits what the survey learned
    PROMPT = "prompt"  # prompts could not be built to length
    LEDGER = "ledger"  # a canary or finding could not be recorded
    INCOMPLETE = "incomplete"  # some answers could not be observed
    DEADLINE = "deadline"  # the job's deadline passed before it finished


class Skip(StrEnum):
    """Why a scheduled job did not start (`leakprobe_job_skips_total{reason}`); nothing was sent."""

    BUDGET = "budget"  # the plan does not fit today's token budget
    BUSY = "busy"  # its previous run is still going
    MISSED = "missed"  # the scheduler woke too late for the slot
    LEDGER = "ledger"  # the ledger does not take writes: nothing may be sent
    LOCKED = "locked"  # another replica is running it
    CLAIMED = "claimed"  # another replica ran it in this slot

    @property
    def turn_taken(self) -> bool:
        """Another replica has the job: how replicas cooperate, not a problem."""
        return self in (Skip.LOCKED, Skip.CLAIMED)


@dataclass(frozen=True)
class JobOutcome:
    failure: Failure | None = None
    skip: Skip | None = None
    message: str = ""
    tokens: int = 0
    blind: bool | None = None  # answers came back and none carried its own canary (None: not a content check)

    @property
    def ok(self) -> bool:
        return self.failure is None and self.skip is None


class JobClock:
    """One run's deadline, a phase at a time (the survey's allowance, then what its plan derives); whether one
    passed."""

    def __init__(self, job: Job) -> None:
        self.name = f"the {job} job's deadline"
        self.passed = False

    @contextmanager
    def phase(self, seconds: float) -> Iterator[None]:
        with run_deadline(seconds, self.name):
            try:
                yield
            finally:
                self.passed = self.passed or deadline_passed() is not None


class TargetSession:
    """One target's transport and runner; `retire()` closes them once the last running job is done.  Every
    request sent to the target goes to `on_exchange` (its health from every job's, those cut short)."""

    def __init__(self, config: TargetConfig, wiring: Wiring, settings: ProberConfig, *, budget: TokenBudget,
                 on_exchange: OnExchange) -> None:
        """`settings`: what the daemon's jobs read of the whole config (daemon, audit, timing and cross-talk)."""
        self.config = config
        self.daemon = settings.daemon
        self.audit = settings.audit
        self.timing = settings.timing
        self.crosstalk = settings.crosstalk
        self.budget = budget
        self.transport = ObservedTransport(config, wiring.scrubber, on_exchange)
        self.runner = TargetRunner(config, self.transport, wiring, telemetry=self.daemon.engine_telemetry)
        self._users = 0
        self._retired = False

    @property
    def name(self) -> str:
        return self.config.name

    async def run(self, job: Job, on_event: Listener) -> JobOutcome:
        """A job that did not complete because its deadline passed fails for that reason (but a ledger that
        failed, which stops all probing, says so)."""
        self._users += 1
        clock = JobClock(job)
        try:
            outcome = await self._outcome(job, on_event, clock)
        finally:
            self._users -= 1
            if self._retired and self._users == 0:
                await self.transport.aclose()
        if clock.passed and outcome.failure not in (None, Failure.LEDGER):
            return replace(outcome, failure=Failure.DEADLINE, message=f"{clock.name} passed: {outcome.message}")
        return outcome

    async def _outcome(self, job: Job, on_event: Listener, clock: JobClock) -> JobOutcome:
        try:
            return await self._run(job, on_event, clock)
        except TargetUnusable as exc:
            return JobOutcome(Failure.UNUSABLE, message=str(exc))
        except PlanError as exc:
            return JobOutcome(Failure.PLAN, message=str(exc))
        except PromptError as exc:
            return JobOutcome(Failure.PROMPT, message=str(exc))
        except LedgerError as exc:
            return JobOutcome(Failure.LEDGER, message=str(exc))

    async def retire(self) -> None:
        self._retired = True
        if self._users == 0:
            await self.transport.aclose()

    async def _run(self, job: Job, on_event: Listener, clock: JobClock) -> JobOutcome:
        runner = self.runner
        if job is Job.PREFLIGHT or job is Job.CAMPAIGN or runner.surveyed is None:
            with clock.phase(SURVEY_ALLOWANCE_S):
                await runner.survey(on_event)  # a campaign plans from a fresh survey; a sentinel needs a counter
        if job is Job.PREFLIGHT:
            return JobOutcome()
        run_id = f"{self.daemon.replica}.{job.value[0]}{secrets.token_hex(3)}-"  # whose run: in every canary
        if job is Job.TIMING or job is Job.CROSSTALK:
            return await self._isolation(job, on_event, run_id, clock)
        if job is Job.SENTINEL:
            sentinel = self.daemon.sentinel
            plan = sentinel_plan(self.name, runner.tenants, tokens=sentinel.tokens, max_tokens=sentinel.max_tokens,
                                 run_id=run_id, retention_s=sentinel.retention, fact_share=runner.wiring.fact_share)
            on_event(PlanReady(plan))
        else:
            a = self.audit
            plan = runner.campaign(on_event, streaming=a.streaming, concurrent=a.concurrent, rounds=1,
                                   max_tokens=a.max_tokens, run_id=run_id)
        return await self._spend(plan, on_event, clock, choose=job is Job.CAMPAIGN)

    async def _isolation(self, job: Job, on_event: Listener, run_id: str, clock: JobClock) -> JobOutcome:
        """The timing check or the cross-talk burst, budgeted like a plan: incomplete where answers went
        unobserved."""
        tenants = self.runner.tenants
        tokens = (timing.planned_tokens(self.timing, tenants) if job is Job.TIMING
                  else crosstalk.planned_tokens(self.crosstalk, tenants))
        day = await self.budget.reserve(self.name, tokens)
        if day is None:
            return await self._over_budget(tokens)
        result: timing.TimingResult | crosstalk.CrosstalkResult | None = None
        seconds = timing_seconds(self.timing, tenants) if job is Job.TIMING else crosstalk_seconds(self.crosstalk)
        try:
            with clock.phase(DEADLINE_BASE_S + seconds):
                if job is Job.TIMING:
                    result = await self.runner.isolation.timing(self.timing, on_event, run_id=run_id)
                else:
                    result = await self.runner.isolation.crosstalk(self.crosstalk, on_event,
                                                                   streaming=self.audit.streaming, run_id=run_id)
        finally:
            await self.budget.release(self.name, day, tokens - (result.tokens if result else 0))
        blind = result.blind if isinstance(result, crosstalk.CrosstalkResult) else None
        if result.errors:
            more = f" (and {len(result.errors) - 1} more)" if len(result.errors) > 1 else ""
            return JobOutcome(Failure.INCOMPLETE, message=result.errors[0] + more, tokens=result.tokens, blind=blind)
        return JobOutcome(tokens=result.tokens, blind=blind)

    async def _over_budget(self, tokens: int) -> JobOutcome:
        left = await self.budget.left(self.name)
        return JobOutcome(skip=Skip.BUDGET, message=f"needs {tokens:,} tokens, {left:,} left today of "
                          f"{self.budget.per_day:,}")

    async def _spend(self, plan: Plan, on_event: Listener, clock: JobClock, *, choose: bool) -> JobOutcome:
        # A campaign measures the probe shape again (the model behind the URL may have changed); a sentinel takes
        # the last one, once there is one.
        choose = choose or self.runner.shape is None
        tokens = plan.tokens + (shapes.planned_tokens(self.config.shapes, self.runner.tenants) if choose else 0)
        day = await self.budget.reserve(self.name, tokens)
        if day is None:
            return await self._over_budget(tokens)
        report = TargetReport(self.name, self.config.url, plan=plan)
        seconds = plan_seconds(plan) + (shape_seconds(self.config.shapes, self.runner.tenants) if choose else 0.0)
        try:
            with clock.phase(DEADLINE_BASE_S + seconds):
                await self.runner.run(plan, report, on_event, choose=choose)
        finally:
            await self.budget.release(self.name, day, tokens - report.tokens_sent)
        blind = bool(report.blind)
        if report.errors:
            more = f" (and {len(report.errors) - 1} more)" if len(report.errors) > 1 else ""
            return JobOutcome(Failure.INCOMPLETE, message=report.errors[0] + more, tokens=report.tokens_sent,
                              blind=blind)
        return JobOutcome(tokens=report.tokens_sent, blind=blind)
