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
from typing import Any

from prober.campaign import crosstalk, sentinel_plan, shapes, timing
from prober.campaign.path import MEASUREMENTS
from prober.campaign.plan import make_plan
from prober.capacity.limits import Capacity, Known
from prober.config import CrosstalkSettings, DaemonSettings, ProberConfig, TimingSettings
from prober.prompts.shape import candidates
from prober.targets.api import Api
from prober.testbed import TestbedServer, build_config
from prober.types import Severity
from tests.support.cli import invoke
from tests.support.shared import BackgroundTenant, Gateway, Traffic
from tests.support.testbed import SMALL

TENANTS = {"tenant-a": "testbed-key-a", "tenant-b": "testbed-key-b", "tenant-c": "testbed-key-c"}
DAY = 86_400.0


def check_of(step: dict[str, Any] | None, finding: dict[str, Any]) -> str:
    """The check a finding (or a request) belongs to."""
    if finding["kind"] == "cross_tenant_cache_timing":
        return "timing"
    if finding["kind"] == "counted_failure":
        return "counters"
    boundary = (step or {}).get("boundary") or finding.get("boundary") or ""
    if boundary == "crosstalk":
        return "cross-talk"
    if boundary == "idle-slot":
        return "idle slots"
    if boundary.startswith("shape:"):
        return "probe shapes"
    if boundary in ("prefix-cache", "repeat"):
        return "prefix cache"
    return "boundaries"


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
            steps = {s["id"]: s for s in target["steps"]}
            for step in target["steps"]:
                requests[check_of(step, {"kind": ""})] += 1
            requests["cross-talk"] += 2 * 4  # the burst's requests (not steps of the report)
            requests["timing"] += timing.planned_requests(TimingSettings(), ["tenant-a", "tenant-b"])  # at most
            requests["idle slots"] += sum(s["checked"] for name, s in target["sight"].items() if name == "idle slots")
            for finding in doc["findings"]:
                if Severity.parse(finding["severity"]) >= Severity.WARNING:
                    check = check_of(steps.get(finding["record_id"]), finding)
                    false[check] += 1
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
    config = ProberConfig.model_validate({"targets": [{"name": "t", "url": "http://t/v1"}]})
    daemon: DaemonSettings = config.daemon
    tenants = ["tenant-a", "tenant-b"]
    shapes_tokens = shapes.planned_tokens(candidates(Api.CHAT), tenants)
    capacities = {
        "tests' small engine (16k context, 4k pool)": Capacity(context_length=Known(16_384, "x"),
                                                              pool_tokens=Known(4_096, "x"),
                                                              max_req_input_len=Known(4_090, "x"),
                                                              page_size=Known(16, "x")),
        "vLLM, 32k context": Capacity(context_length=Known(32_768, "x"), pool_tokens=Known(55_356, "x"),
                                      page_size=Known(16, "x")),
        "the incident (1M context, 681k pool)": Capacity(context_length=Known(1_048_576, "x"),
                                                         pool_tokens=Known(681_280, "x"),
                                                         max_req_input_len=Known(681_274, "x"),
                                                         page_size=Known(64, "x")),
    }
    per_day = {job: DAY / daemon.interval(job) for job in ("sentinel", "campaign", "timing", "crosstalk")}
    print(f"\nruns a day at the default schedules: {', '.join(f'{j} {n:g}' for j, n in per_day.items())}")
    print(f"{'capacity':<42} {'path':>5} {'sentinel':>12} {'campaign':>14} {'timing':>12} {'cross-talk':>11} "
          f"{'a day':>15}")
    for label, capacity in capacities.items():
        for overhead in (0, 300):
            requests = {}
            sentinel = sentinel_plan("t", tenants, tokens=daemon.sentinel.tokens, max_tokens=64)
            campaign = make_plan("t", capacity, tenants, max_tokens=config.audit.max_tokens)
            requests["sentinel"] = (sentinel.tokens + overhead * _steps(sentinel)) * per_day["sentinel"]
            requests["campaign"] = (campaign.tokens + shapes_tokens + overhead * len(tenants)
                                    * len(candidates(Api.CHAT)) + 2 * MEASUREMENTS * len(tenants) * 16
                                    ) * per_day["campaign"]
            t: TimingSettings = config.timing
            requests["timing"] = (timing.planned_tokens(t, tenants) + overhead * timing.planned_requests(t, tenants)
                                  ) * per_day["timing"]
            c: CrosstalkSettings = config.crosstalk
            requests["crosstalk"] = (crosstalk.planned_tokens(c, tenants) + overhead * len(tenants) * c.per_tenant
                                     ) * per_day["crosstalk"]
            total = sum(requests.values())
            print(f"{label:<42} {overhead:>5} {requests['sentinel']:>12,.0f} {requests['campaign']:>14,.0f} "
                  f"{requests['timing']:>12,.0f} {requests['crosstalk']:>11,.0f} {total:>15,.0f}")
    print(f"(the daemon's default budget: {daemon.tokens_per_day:,} a day per target; a job over it is skipped)")


def _steps(plan: Any) -> int:
    return sum(len(e.steps) for e in plan.exchanges)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--audits", type=int, default=10)
    parser.add_argument("--rate", type=float, default=2.0, help="the third tenant's requests a second")
    args = parser.parse_args()
    false_findings(args.audits, args.rate)
    daily_tokens()


if __name__ == "__main__":
    main()
