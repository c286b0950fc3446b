"""The daemon's three jobs for one target, on one runner (one open transport, one survey, one prompt-length
cache) that the jobs share until a reload retires it.

- `preflight`: capacity survey and verdicts; sends no generation request.
- `sentinel`: everyday-sized canary prompts from each tenant in turn, every answer scanned.
- `campaign`: the boundary campaign of `leakprobe audit`.

Each returns a `JobOutcome`; what it says goes to the metrics, the log and `/status`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from enum import StrEnum

from prober.campaign import TargetReport, TargetRunner, sentinel_plan
from prober.campaign.events import Listener
from prober.campaign.plan import Plan
from prober.campaign.wiring import Wiring
from prober.config import AuditSettings, DaemonSettings, TargetConfig
from prober.daemon.budget import TokenBudget
from prober.errors import BuildError, CountError, LedgerError, PlanError, TargetUnusable
from prober.targets.transport import Transport


class Job(StrEnum):
    PREFLIGHT = "preflight"
    SENTINEL = "sentinel"
    CAMPAIGN = "campaign"


@dataclass(frozen=True)
class JobOutcome:
    ok: bool
    reason: str = ""  # why not: unusable | plan | prompt | ledger | incomplete | budget
    message: str = ""
    skipped: bool = False  # never started (budget): nothing was sent
    tokens: int = 0


class TargetSession:
    """One target's transport and runner; `retire()` closes them once the last running job is done."""

    def __init__(self, config: TargetConfig, wiring: Wiring, *, daemon: DaemonSettings, audit: AuditSettings,
                 budget: TokenBudget) -> None:
        self.config = config
        self.daemon = daemon
        self.audit = audit
        self.budget = budget
        self.transport = Transport(config.policy(), wiring.scrubber)
        self.runner = TargetRunner(config, self.transport, wiring, telemetry=daemon.engine_telemetry)
        self._users = 0
        self._retired = False

    @property
    def name(self) -> str:
        return self.config.name

    async def run(self, job: Job, on_event: Listener) -> JobOutcome:
        self._users += 1
        try:
            return await self._run(job, on_event)
        except TargetUnusable as exc:
            return JobOutcome(False, "unusable", str(exc))
        except PlanError as exc:
            return JobOutcome(False, "plan", str(exc))
        except (CountError, BuildError) as exc:
            return JobOutcome(False, "prompt", str(exc))
        except LedgerError as exc:
            return JobOutcome(False, "ledger", str(exc))
        finally:
            self._users -= 1
            if self._retired and self._users == 0:
                await self.transport.aclose()

    async def retire(self) -> None:
        self._retired = True
        if self._users == 0:
            await self.transport.aclose()

    async def _run(self, job: Job, on_event: Listener) -> JobOutcome:
        runner = self.runner
        if job is Job.PREFLIGHT or job is Job.CAMPAIGN or runner.surveyed is None:
            await runner.survey(on_event)  # a campaign plans from a fresh survey; a sentinel needs a counter
        if job is Job.PREFLIGHT:
            return JobOutcome(True)
        run_id = f"{self.daemon.replica}.{job.value[0]}{secrets.token_hex(3)}-"  # whose run: in every canary
        if job is Job.SENTINEL:
            sentinel = self.daemon.sentinel
            plan = sentinel_plan(self.name, runner.tenants, tokens=sentinel.tokens, max_tokens=sentinel.max_tokens,
                                 run_id=run_id, retention_s=sentinel.retention,
                                 fact_share=runner.wiring.fact_share)
        else:
            a = self.audit
            plan = runner.campaign(on_event, streaming=a.streaming, concurrent=a.concurrent, rounds=1,
                                   max_tokens=a.max_tokens, run_id=run_id)
        return await self._spend(plan, on_event)

    async def _spend(self, plan: Plan, on_event: Listener) -> JobOutcome:
        day = await self.budget.reserve(self.name, plan.tokens)
        if day is None:
            left = await self.budget.left(self.name)
            return JobOutcome(False, "budget", f"needs {plan.tokens:,} tokens, {left:,} left today of "
                              f"{self.budget.per_day:,}", skipped=True)
        report = TargetReport(self.name, self.config.url, plan=plan)
        try:
            await self.runner.run(plan, report, on_event)
        finally:
            await self.budget.release(self.name, day, plan.tokens - report.tokens_sent)
        if report.errors:
            more = f" (and {len(report.errors) - 1} more)" if len(report.errors) > 1 else ""
            return JobOutcome(False, "incomplete", report.errors[0] + more, tokens=report.tokens_sent)
        return JobOutcome(True, tokens=report.tokens_sent)
