"""`leakprobe audit`: every target of the config surveyed, every registered check that runs in audits planned,
budgeted and run against it in turn (prober/checks); as a library call, credentials, ledger and key in, result and
exit code out."""

from __future__ import annotations

import time
from collections.abc import Mapping

from prober.canaries.keys import resolve_key
from prober.canaries.mint import Minter
from prober.checks import (
    DEADLINE_BASE_S,
    REGISTRY,
    SURVEY_ALLOWANCE_S,
    Check,
    Planned,
    Registry,
    Run,
    perform,
    planning,
)
from prober.config.schema import ProberConfig, TargetConfig
from prober.domain.errors import BuildError, CountError, PlanError, TargetUnusable
from prober.domain.types import Severity
from prober.domain.verdicts import AuditVerdict
from prober.embeddings import Embedder
from prober.ledger import open_ledger
from prober.probing import AuditResult, TargetReport
from prober.probing.context import TargetContext
from prober.probing.events import Listener, PlanReady, TargetFailed, ignore
from prober.probing.scanning import ledger_scanner
from prober.probing.secrets import scrubber_for
from prober.probing.wiring import Wiring, close_spans, exported_spans
from prober.targets.bounds import deadline_passed, run_deadline
from prober.targets.credentials import Secret
from prober.targets.transport import Transport

TARGET_DEADLINE = "the audit's deadline for this target"


class Auditor:
    def __init__(self, config: ProberConfig, minter: Minter, secrets: Mapping[str, Secret | None], *,
                 on_event: Listener = ignore, checks: Registry = REGISTRY, known_bugs: bool = False) -> None:
        """`minter`: the ledger, the deployment key and the embedder, which the audit mints and scans with; every
        secret (and the ledger's password) is scrubbed from whatever leaves it.  `known_bugs`: also run the checks
        of the bug-table rows each target's release is in (the deploy gate's), but those `audit.skip` names."""
        self.config = config
        self.scrubber = scrubber_for(dict(secrets), ledger=config.ledger)
        self.secrets = secrets
        self.minter = minter
        self.on_event = on_event
        self.registry = checks
        self.checks = checks.selected(config)
        self.known_bugs = known_bugs
        self.tokens_left = config.audit.token_budget

    async def run(self, *, dry_run: bool = False) -> AuditResult:
        """`dry_run`: survey and plan every target, spend nothing and send no probe."""
        result = AuditResult(dry_run=dry_run)
        # A dry run sends nothing, so it scans nothing: no need to index the ledger's canaries.
        scanner = await ledger_scanner(self.minter, [t.name for t in self.config.tenants], read=not dry_run)
        spans = None if dry_run else exported_spans(self.config)
        wiring = Wiring.of(self.config, self.minter, scanner, self.secrets, self.scrubber, bugs=self.registry,
                           spans=spans)
        try:
            await self._run_targets(result, wiring, dry_run)
        finally:
            await close_spans(spans)
        result.finished = time.time()
        return result

    async def _run_targets(self, result: AuditResult, wiring: Wiring, dry_run: bool) -> None:
        deadline = self.config.audit.deadline
        with run_deadline(deadline, "the audit's deadline"):
            for target_config in self.config.targets:
                report = TargetReport(target_config.name, target_config.url,
                                      price_per_mtok=target_config.price_per_mtok)
                result.targets.append(report)
                if deadline_passed():
                    report.errors.append(f"not probed: the audit's deadline of {deadline:g} s passed")
                    continue
                try:
                    with run_deadline(self.config.audit.target_deadline, TARGET_DEADLINE):
                        await self._run_target(target_config, report, wiring, dry_run)
                except (TargetUnusable, PlanError, CountError, BuildError) as exc:
                    report.errors.append(str(exc))
                    self.on_event(TargetFailed(target_config.name, str(exc)))

    async def _run_target(self, cfg: TargetConfig, report: TargetReport, wiring: Wiring, dry_run: bool) -> None:
        """Under the target's deadline when one is given, else the survey's allowance and then one derived from
        what the checks plan."""
        settings = self.config.audit
        derived = settings.target_deadline is None
        async with Transport(cfg.policy(), self.scrubber, spans=wiring.spans) as transport:
            ctx = TargetContext(cfg, transport, wiring, telemetry=not dry_run)
            try:
                with run_deadline(SURVEY_ALLOWANCE_S if derived else None, TARGET_DEADLINE):
                    await ctx.survey(self.on_event, bisect_budget=0 if dry_run else settings.bisect_budget)
            finally:
                report.survey = ctx.surveyed
            run = Run(ctx, self.config, on_event=self.on_event)
            bugs = ctx.surveyed.bugs if ctx.surveyed else ()  # those its release has: their checks go first
            added = [c for c in self.registry.probing(bugs) if c not in self.checks
                     and c.name not in self.config.audit.skip] if self.known_bugs else []
            checks = self.registry.ordered(self.checks + added, bugs)
            planned = [(check, planning(check, run)) for check in checks]
            planned = self._within_budget(planned, added)
            report.planned = {check.name: p for check, p in planned}
            self._spend(cfg, planned, dry_run)
            if dry_run:
                for plan in report.plans:
                    self.on_event(PlanReady(plan))
                report.complete = True
                return
            rest = DEADLINE_BASE_S + sum(p.seconds for _, p in planned)
            with run_deadline(rest if derived else None, TARGET_DEADLINE):
                await self._checks(run, planned, report)
            report.paths = ctx.routes.paths
            reason = report.coverage().reason()
            if reason:
                report.errors.insert(0, reason)  # the one-line why, ahead of the requests it sums up
            report.complete = not report.errors

    def _within_budget(self, planned: list[tuple[Check, Planned]], added: list[Check]) -> list[tuple[Check, Planned]]:
        """A known bug's check the ceiling has no room for, after what was asked for, is not run (it says so):
        the gate decides the boundary first, and probes known bugs with what is left."""
        room = self.tokens_left - sum(p.tokens for check, p in planned if check not in added)
        kept = []
        for check, p in planned:
            if check in added and p.tokens > room:
                p = Planned.moot_because(f"a known bug's check whose plan of {p.tokens:,} tokens is over what the "
                                         f"token ceiling leaves ({max(room, 0):,}); raise it to run this check")
            room -= p.tokens if check in added else 0
            kept.append((check, p))
        return kept

    def _spend(self, cfg: TargetConfig, planned: list[tuple[Check, Planned]], dry_run: bool) -> None:
        """The audit's token budget, for everything the target's checks plan (raises PlanError, nothing sent)."""
        tokens = sum(p.tokens for _, p in planned)
        if tokens > self.tokens_left:
            raise PlanError(f"the plan for {cfg.name} needs {tokens:,} tokens, over the remaining budget of "
                            f"{self.tokens_left:,}; raise --token-budget (the gate's --max-tokens) or lower `rounds`")
        if not dry_run:
            self.tokens_left -= tokens

    async def _checks(self, run: Run, planned: list[tuple[Check, Planned]], report: TargetReport) -> None:
        """In the planned order (the registry's, the known bugs' checks first); none after one that stopped (the
        deadline, the circuit breaker)."""
        for check, p in planned:
            if (stop := run.target.wiring.stop_reason()) is not None:
                report.errors.append(f"not run: {check.name}: {stop}")
                continue
            result = await perform(check, run, p)
            report.results.append(result)
            report.errors += result.errors
            if result.stopped:
                break


async def run_audit(config: ProberConfig, secrets: dict[str, Secret | None], *, dry_run: bool = False,
                    embedder: Embedder | None = None, on_event: Listener = ignore,
                    known_bugs: bool = False) -> AuditResult:
    ledger = open_ledger(config.ledger)
    try:
        auditor = Auditor(config, Minter(ledger, resolve_key(ledger), embedder), secrets, on_event=on_event,
                          known_bugs=known_bugs)
        return await auditor.run(dry_run=dry_run)
    finally:
        ledger.close()


def exit_code(result: AuditResult, fail_on: Severity) -> int:
    """By the verdict table (prober/domain/verdicts.py): 1 for a leak or an engine fault seen, finished or not; 2 for
    an audit that could not see or did not finish; else 1 for a finding at or above `fail_on`, 0 for none."""
    return AuditVerdict.of(result).exit_code(fail_on)
