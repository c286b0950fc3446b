"""A shared endpoint: false findings per check, and what the daemon spends per target per day.

Part 1: the reference engine (the `fixed` preset at the tests' small sizes: the abort honoured) behind the test
gateway (tests/support/shared.py: the operator's system prompt before every chat, a 502 after the engine served on
5% of requests) with a third tenant at `--rate` requests a second (ordinary questions, prompts over the input
limit, abandoned streams, hang-ups: aborts in the engine's counters).  `--audits` whole audits (timing, cross-talk
and idle slots at their defaults); every finding of warning or worse on this healthy engine is false, counted per
check per 1,000 requests that check sent, beside the background abort rate the engine counted.

Part 2: prompt tokens a daemon sends one target per day at the default schedules and settings, from the plans
themselves, for three capacities (the tests' small engine, a 32k vLLM, the incident's 1M context), the path to the
engine adding nothing and 300 tokens.

    python bench/shared.py [--audits N] [--rate R]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from planning import CAPACITIES, default_config, planning, run_for  # bench/planning.py

from prober.checks import REGISTRY
from prober.daemon.schedule import PREFLIGHT, Timetable
from prober.domain.types import Severity
from prober.testbed import TestbedServer, build_config
from tests.support.cli import invoke
from tests.support.shared import BackgroundTenant, Gateway, Traffic
from tests.support.testbed import SMALL

TENANTS = {"tenant-a": "testbed-key-a", "tenant-b": "testbed-key-b", "tenant-c": "testbed-key-c"}
DAY = 86_400.0


def false_findings(audits: int, rate: float) -> None:
    engine = TestbedServer(build_config("fixed", {**SMALL, "tenants": TENANTS})).start()
    requests: Counter[str] = Counter()
    false: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    aborted, seconds = engine.engine.stats.aborted, 0.0
    with tempfile.TemporaryDirectory(prefix="bench-shared-") as scratch, \
            Gateway(engine.url, fail_after_served=0.05) as front, \
            BackgroundTenant(front.url + "/v1", TENANTS["tenant-c"], Traffic(rate=rate)):
        for n in range(audits):
            began = time.monotonic()
            result = invoke("audit", "--target", front.url + "/v1", "--tenant", "tenant-a=LP_A", "--tenant",
                            "tenant-b=LP_B", "--ledger", str(Path(scratch) / f"l{n}.sqlite"), "-f", "json",
                            "--no-semantic")
            seconds += time.monotonic() - began
            doc = json.loads(result.stdout)
            target = doc["targets"][0]
            for check in target["checks"]:
                requests[check["check"]] += check["requests"]
            for finding in doc["findings"]:
                if Severity.parse(finding["severity"]) >= Severity.WARNING:
                    false[finding["check"]] += 1
                    kinds[finding["kind"]] += 1
            print(f"audit {n + 1}: exit {result.exit_code}, {len(doc['findings'])} findings "
                  f"({sum(false.values())} false so far), {time.monotonic() - began:.1f} s", flush=True)
    background = engine.engine.stats.aborted - aborted
    engine.stop()
    print(f"\n{audits} audits of the healthy engine behind the gateway, {seconds:.0f} s; the engine counted "
          f"{background} aborts meanwhile ({60 * background / seconds:.1f} a minute), none leakprobe's")
    print(f"{'check':<14} {'requests':>9} {'false findings':>15} {'per 1,000':>10}")
    for check in sorted(check for check in set(requests) | set(false) if requests[check] or false[check]):
        sent = requests[check]
        print(f"{check:<14} {sent:>9,} {false[check]:>15} {1000 * false[check] / sent:>10.2f}")
    if kinds:
        print("by kind:", dict(kinds))


def daily_tokens() -> None:
    """Every job the daemon runs by default, planned by its own check (the registry's), at its default interval."""
    config = default_config()
    timetable = Timetable(config.daemon, REGISTRY)
    jobs = [job for job in timetable.jobs if job != PREFLIGHT]
    print(f"\nruns a day at the default schedules (before a large plan paces them): "
          f"{', '.join(f'{j} {DAY / timetable.interval(j):g}' for j in jobs)}")
    print(f"{'capacity':<42} {'path':>5} " + " ".join(f"{j:>12}" for j in jobs) + f" {'a day':>14}")
    with planning(config) as context:
        for label, capacity in CAPACITIES.items():
            run = run_for(context, config, capacity)
            for overhead in (0, 300):
                day = {}
                for job in jobs:
                    planned = REGISTRY.get(job).planned(run)
                    every = timetable.interval(job, planned.tokens)  # paced as the daemon paces it
                    day[job] = (planned.tokens + overhead * planned.requests) * DAY / every
                print(f"{label:<42} {overhead:>5} " + " ".join(f"{day[j]:>12,.0f}" for j in jobs)
                      + f" {sum(day.values()):>14,.0f}")
    print(f"(the daemon's default budget: {config.daemon.tokens_per_day:,} a day per target; a job over it is "
          "skipped; a path is measured once per route a daemon uses, not per run)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--audits", type=int, default=10)
    parser.add_argument("--rate", type=float, default=2.0, help="the third tenant's requests a second")
    args = parser.parse_args()
    false_findings(args.audits, args.rate)
    daily_tokens()


if __name__ == "__main__":
    main()
