"""The daemon's jobs for one target, on one context (one open transport, one survey, one prompt-length cache)
that the jobs share until a reload retires it: `preflight` (the capacity survey and verdicts; it sends no
generation request), then one job per registered check (prober/checks: the probe shape, the prefix cache, the
campaign, the sentinel, timing, idle slots, cross-talk).

Each returns a `JobOutcome`; what it says goes to the metrics, the log and `/status`.  Each runs under a deadline
of its own, derived like an audit's (the survey's allowance, then what the check plans): a target that never
finishes its answers ends the job there, and the job's next run and the other targets' jobs keep their slots.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from prober.checks import DEADLINE_BASE_S, SURVEY_ALLOWANCE_S, Check, Run, perform
from prober.config.schema import TargetConfig
from prober.daemon.budget import TokenBudget
from prober.daemon.observed import ObservedTransport, OnExchange
from prober.daemon.outcomes import Failure, JobOutcome, Skip
from prober.daemon.schedule import PREFLIGHT
from prober.daemon.settings import Settings
from prober.domain.errors import LeakprobeError, LedgerError, PlanError, PromptError, TargetUnusable
from prober.probing import TargetContext
from prober.probing.events import Listener, ignore
from prober.probing.results import Sight
from prober.probing.wiring import Wiring
from prober.targets.bounds import deadline_passed, run_deadline


class JobClock:
    """One run's deadline, a phase at a time (the survey's allowance, then what its check plans); whether one
    passed."""

    def __init__(self, job: str) -> None:
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
    """One target's transport and context; `retire()` closes them once the last running job is done.  Every
    request sent to the target goes to `on_exchange` (its health from every job's, those cut short)."""

    deadline_base_s = DEADLINE_BASE_S  # what each job's deadline allows beyond its plan's requests at the floors

    def __init__(self, config: TargetConfig, settings: Settings, wiring: Wiring, *, budget: TokenBudget,
                 on_exchange: OnExchange) -> None:
        """`settings`: the daemon's, its whole config (each check reads its own part) and the checks' registry."""
        self.config = config
        self.settings = settings.config
        self.checks = settings.checks
        self.timetable = settings.timetable
        self.budget = budget
        self.transport = ObservedTransport(config, wiring.scrubber, on_exchange, spans=wiring.spans)
        self.context = TargetContext(config, self.transport, wiring, telemetry=self.settings.daemon.engine_telemetry)
        self._users = 0
        self._retired = False
        self._sights: dict[str, Sight] = {}  # each content check's last, by check

    @property
    def name(self) -> str:
        return self.config.name

    async def run(self, job: str, on_event: Listener) -> JobOutcome:
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

    async def _outcome(self, job: str, on_event: Listener, clock: JobClock) -> JobOutcome:
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

    def _blind(self, check: Check, sight: Sight | None) -> bool | None:
        """Whether its answers could not have shown a leak: none of its probes', nor (by their last runs) those of
        the checks that build their probes alike, repeated their own canary (None: it reads no content)."""
        if sight is None:
            return None
        self._sights[check.name] = sight
        alike = [c.name for c in self.checks if check.sees_with and c.sees_with == check.sees_with] or [check.name]
        return all(self._sights[name].blind for name in alike if name in self._sights)

    async def retire(self) -> None:
        self._retired = True
        if self._users == 0:
            await self.transport.aclose()

    async def _run(self, job: str, on_event: Listener, clock: JobClock) -> JobOutcome:
        ctx = self.context
        check = None if job == PREFLIGHT else self.checks.get(job)
        if check is None or check.survey or ctx.surveyed is None:
            with clock.phase(SURVEY_ALLOWANCE_S):
                await ctx.survey(on_event)  # a campaign plans from a fresh survey; every check needs a counter
        if check is None:
            return JobOutcome(plans=self._plans())
        run_id = f"{self.settings.daemon.replica}.{job[0]}{secrets.token_hex(3)}-"  # whose run: in every canary
        run = Run(ctx, self.settings, run_id, on_event)
        planned = check.planned(run)
        plans = {job: planned.tokens}
        day = await self.budget.reserve(self.name, planned.tokens)
        if day is None:
            left = await self.budget.left(self.name)
            return JobOutcome(skip=Skip.BUDGET, message=f"needs {planned.tokens:,} tokens, {left:,} left today of "
                              f"{self.budget.per_day:,}", plans=plans)
        tokens = 0
        try:
            with clock.phase(self.deadline_base_s + planned.seconds):
                result = await perform(check, run, planned)
                tokens = result.tokens
        finally:
            await self.budget.release(self.name, day, planned.tokens - tokens)
        blind = self._blind(check, result.sight)
        if result.errors:
            more = f" (and {len(result.errors) - 1} more)" if len(result.errors) > 1 else ""
            return JobOutcome(Failure.INCOMPLETE, message=result.errors[0] + more, tokens=tokens, blind=blind,
                              plans=plans)
        return JobOutcome(tokens=tokens, blind=blind, plans=plans)

    def _plans(self) -> dict[str, int]:
        """What each scheduled check would send now, planned from the survey (pure: nothing is sent); a check that
        cannot plan here (the capacity unknown) is left out."""
        plans = {}
        for job in self.timetable.jobs:
            if job == PREFLIGHT:
                continue
            try:
                plans[job] = self.checks.get(job).planned(Run(self.context, self.settings, "", ignore)).tokens
            except LeakprobeError:
                continue
        return plans
