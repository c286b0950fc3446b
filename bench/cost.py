"""What an audit costs a target: prompt tokens sent, the part the engine prefilled (served: what it computes and
usually bills; a correct engine refuses a prompt over its limit before prefill), and requests; the spare campaign
(the default) against the whole matrix (`--thorough`, the previous plan) in the same run (issue 54).

    python bench/cost.py plans [--json]     # from the plans alone, per check, for each capacity of bench/planning.py
    python bench/cost.py runs [--json]      # audits of the reference engine: each bug-table row and the incident
    python bench/cost.py day [--json]       # a daemon's day at the default schedules, as it projects it

`runs` audits the reference engine (in this process, over loopback HTTP) with each row of the engine-bug table's
fault at the tests' sizes, then the `incident` and `fixed` presets at their full sizes (1,048,576-token context,
681,280-token pool), each twice: thorough and spare.  It reports the tokens to the first catch (the first answer
carrying the row's finding, with everything every earlier check and step sent) and for the whole audit.  The
audits run every check the engine-bug tests run (timing off: it plans alike either way, 516,096 tokens)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from planning import CAPACITIES, default_config, planning, run_for  # bench/planning.py

from prober.canaries.keys import KEY_ENV
from prober.checks import REGISTRY
from prober.config.schema import TargetConfig, assemble_config
from prober.daemon.schedule import PREFLIGHT, Timetable
from prober.daemon.spending import Projection
from prober.domain.types import FindingKind
from prober.oneshot.audit import run_audit
from prober.probing import AuditResult
from prober.targets.credentials import Secret
from prober.testbed import TestbedServer, build_config
from tests.support.testbed import DEPLOYMENT_KEY, bug_engine

KEYS = {"tenant-a": "testbed-key-a", "tenant-b": "testbed-key-b"}
MODES = {"thorough": True, "spare": False}


def plans() -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for mode, thorough in MODES.items():
        config = default_config()
        config = config.model_copy(update={"audit": config.audit.model_copy(update={"thorough": thorough})})
        checks = REGISTRY.selected(config)
        with planning(config) as context:
            for label, capacity in CAPACITIES.items():
                run = run_for(context, config, capacity)
                rows = {}
                for check in checks:
                    planned = check.planned(run)
                    rows[check.name] = {"sent": planned.tokens, "served": planned.served,
                                        "requests": planned.requests}
                rows["audit"] = {k: sum(r[k] for r in rows.values()) for k in ("sent", "served", "requests")}
                doc.setdefault(label, {})[mode] = rows
    return doc


def day() -> dict[str, Any]:
    """What a daemon at the default schedules and budget projects for one target a day (prober/daemon/spending.py's
    `Projection`), from the same plans its preflight makes and at the intervals they pace its jobs to
    (`daemon.job_share`), for each capacity of bench/planning.py."""
    config = default_config()
    timetable = Timetable(config.daemon, REGISTRY)
    doc: dict[str, Any] = {}
    with planning(config) as context:
        for label, capacity in CAPACITIES.items():
            run = run_for(context, config, capacity)
            plans = {job: REGISTRY.get(job).planned(run).tokens for job in timetable.jobs if job != PREFLIGHT}
            every = {job: timetable.interval(job, plans.get(job, 0)) for job in timetable.jobs}  # paced
            projection = Projection.of("t", config.daemon.tokens_per_day, plans, every)
            assert projection is not None
            doc[label] = {"day": projection.tokens, "budget": projection.budget, "by_job": dict(projection.by_job),
                          "every": every, "log": None if projection.fits else projection.describe()}
    return doc


def audit(url: str, ledger: Path, target: dict[str, Any], thorough: bool) -> AuditResult:
    cfg = assemble_config(None, target=url + "/v1", tenants=["tenant-a=LP_A", "tenant-b=LP_B"], ledger=str(ledger),
                          semantic=False, timing=False, thorough=thorough, token_budget=10**9)
    cfg = cfg.model_copy(update={"targets": [TargetConfig.model_validate({**cfg.targets[0].model_dump(), "timeout_s":
                                                                           600, "retries": 0, **target})]})
    return asyncio.run(run_audit(cfg, {t: Secret(k) for t, k in KEYS.items()}))


def spent(result: AuditResult, kind: FindingKind | None) -> dict[str, Any]:
    """Tokens sent and served for the whole audit, and up to the first answer with a finding of `kind`."""
    [target] = result.targets
    sent = served_tokens = requests = 0
    first: dict[str, int] | None = None
    for check in target.results:
        for step in check.steps:
            sent += step.sent_tokens
            served_tokens += step.sent_tokens if step.answer.served else 0
            requests += 1
            if first is None and kind is not None and any(f.kind is kind for f in step.findings):
                first = {"sent": sent, "served": served_tokens, "requests": requests}
        sent += check.other_tokens
        served_tokens += check.other_tokens  # a timing pair's or a burst's prompts fit: served
        if first is None and kind is not None and any(f.kind is kind for f in check.extra):
            first = {"sent": sent, "served": served_tokens, "requests": requests}
    return {"sent": sent, "served": served_tokens, "requests": requests, "first_catch": first,
            "caught": any(f.kind is kind for f in result.findings) if kind else None,
            "findings_high": sum(1 for f in result.findings if f.severity.label in ("high", "critical"))}


def runs() -> dict[str, Any]:
    os.environ.setdefault(KEY_ENV, DEPLOYMENT_KEY)
    cases: list[tuple[str, str, dict[str, Any], dict[str, Any], FindingKind | None]] = [
        (bug.public.split(",")[0], "fixed", {**bug_engine(bug), "faults": bug.faults}, bug.audit, bug.kind)
        for bug in REGISTRY.bugs]
    cases += [("incident preset, full size", "incident", {}, {}, FindingKind.CROSS_TENANT_ECHO),
              ("fixed preset, full size", "fixed", {}, {}, None)]
    doc: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cost-") as scratch:
        for n, (label, preset, engine, target, kind) in enumerate(cases):
            for mode, thorough in MODES.items():
                server = TestbedServer(build_config(preset, engine)).start()
                try:
                    result = audit(server.url, Path(scratch) / f"{n}-{mode}.sqlite", target, thorough)
                finally:
                    server.stop()
                doc.setdefault(label, {})[mode] = spent(result, kind)
                print(f"{label} ({mode}): {doc[label][mode]}", file=sys.stderr)
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("plans", "runs", "day"))
    parser.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = parser.parse_args()
    os.environ.setdefault("LP_A", KEYS["tenant-a"])
    os.environ.setdefault("LP_B", KEYS["tenant-b"])
    doc = {"plans": plans, "runs": runs, "day": day}[args.what]()
    if args.json or args.what == "day":
        print(json.dumps(doc, indent=2))
    elif args.what == "plans":
        for label, modes in doc.items():
            print(f"\n{label}\n{'check':<14} " + " ".join(f"{m + ' ' + k:>18}" for m in MODES
                                                             for k in ("sent", "served")))
            for name in modes["spare"]:
                print(f"{name:<14} " + " ".join(f"{modes[m][name][k]:>18,}" for m in MODES for k in ("sent", "served")))
    else:
        print(f"{'case':<44} {'mode':<9} {'sent':>12} {'served':>12} {'to catch: sent':>15} {'served':>12} caught")
        for label, modes in doc.items():
            for mode, r in modes.items():
                first = r["first_catch"] or {"sent": 0, "served": 0}
                print(f"{label[:44]:<44} {mode:<9} {r['sent']:>12,} {r['served']:>12,} {first['sent']:>15,} "
                      f"{first['served']:>12,} {r['caught']}")


if __name__ == "__main__":
    main()
