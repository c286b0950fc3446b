"""Checks that run a plan of exchanges (prober/probing/plan.py): the boundary campaign, the prefix-cache check and
the sentinel differ only in the plan they make."""

from __future__ import annotations

from abc import abstractmethod

from prober.checks.base import Check, Run
from prober.checks.shapes import shaped
from prober.probing.events import CheckDone
from prober.probing.exchanges import run_plan
from prober.probing.plan import Plan, Planned
from prober.probing.results import CheckResult

LONG_PROMPTS = "long-prompts"  # the campaign's and the prefix cache's probes: planted and laid out alike


class PlanCheck(Check):
    @abstractmethod
    def plan(self, run: Run) -> Plan:
        """Its exchanges for what the survey learned (raises PlanError)."""

    def planned(self, run: Run) -> Planned:
        return Planned.of_plan(self.plan(run))

    async def run(self, run: Run, planned: Planned) -> CheckResult:
        result = CheckResult(check=self.name, sees_with=self.sees_with)
        await shaped(run, result)
        await run_plan(run.target, planned.plan or self.plan(run), result, run.on_event)
        run.on_event(CheckDone(run.target.config.name, result))
        return result
