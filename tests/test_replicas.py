"""Two `leakprobe daemon` replicas sharing one PostgreSQL ledger against the reference engine's incident.

They take turns (one campaign per slot, never two at once), merge their findings into one incident per
tenant pair, attribute each other's canaries (facts included, which only the ledger can attribute), and a
replica killed while it holds a job leaves the job to the other at its next slot.
"""

from __future__ import annotations

import re
import signal
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from prober.domain.incidents import IncidentKey
from prober.domain.types import Canary, CanaryKind, Finding, FindingKind
from prober.ledger import open_ledger
from tests.support.daemonproc import DaemonProcess, daemon_config
from tests.support.postgres import PostgresServer
from tests.support.testbed import SMALL, StartTestbed

CAMPAIGN_S = 5.0
SCHEDULE = {"preflight": "2s", "sentinel": "1s", "campaign": f"{CAMPAIGN_S:g}s"}
JITTER = {"preflight": "200ms", "sentinel": "200ms", "campaign": "200ms"}
# Only campaigns take turns in the first test: its preflight and sentinel run once, at start.  (A daemon at
# second-scale schedules keeps a core busy with sentinels alone, and two of them starved the campaigns.)
CAMPAIGNS_ONLY = {**SCHEDULE, "preflight": "1h", "sentinel": "1h"}
# The incident's shape at a quarter of SMALL: a campaign sends ~50,000 tokens instead of ~180,000.
QUARTER = {**SMALL, "context_length": SMALL["context_length"] // 4, "pool_tokens": SMALL["pool_tokens"] // 4}
_DONE = re.compile(r"^(\S+ \S+) INFO \S+: campaign testbed: ok in ([\d.]+) s")


def replica(url: str, ledger_url: str, name: str, folder: Path, **daemon: Any) -> DaemonProcess:
    """A replica whose ledger URL has no password: it comes from PGPASSWORD, as a secret would provide it."""
    user, _, rest = ledger_url.removeprefix("postgresql://").partition("@")
    login, _, password = user.partition(":")
    config = daemon_config(url, Path("unused"), **{"schedule": SCHEDULE, "jitter": JITTER, "replica": name, **daemon})
    config["ledger"] = f"postgresql://{login}@{rest}"
    return DaemonProcess(config, folder, name=name, env={"PGPASSWORD": password})


def campaigns(log: Path) -> list[tuple[float, float]]:
    """(start, end) of each completed campaign, from the replica's log."""
    runs = []
    for line in log.read_text().splitlines():
        done = _DONE.match(line)
        if done:
            end = datetime.strptime(done.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            runs.append((end - float(done.group(2)), end))
    return runs


@pytest.mark.slow
def test_two_replicas_share_one_ledger(testbed: StartTestbed, postgres: PostgresServer, tmp_path: Path) -> None:
    server = testbed("incident", **QUARTER)
    ledger_url = postgres.create_database()
    with (replica(server.url, ledger_url, "a", tmp_path, schedule=CAMPAIGNS_ONLY) as a,
          replica(server.url, ledger_url, "b", tmp_path, schedule=CAMPAIGNS_ONLY) as b):
        def both_found() -> bool:
            return all(d.sample("leakprobe_findings_total", kind="cross_tenant_echo") > 0 for d in (a, b))

        a.wait_for(lambda: both_found() and len(campaigns(a.log_path) + campaigns(b.log_path)) >= 6, 120,
                   "both replicas to find leaks over six campaigns")
        turns = sum(d.sample("leakprobe_job_skips_total", job="campaign", reason=r) for d in (a, b)
                    for r in ("claimed", "locked"))
        status = {d.get("/status").json()["replica"] for d in (a, b)}
        assert a.stop() == 0 and b.stop() == 0
    assert status == {"a", "b"} and turns > 0
    runs = sorted(campaigns(a.log_path) + campaigns(b.log_path))
    for (start, end), (next_start, _) in pairwise(runs):
        assert next_start >= end - 0.05, "two campaigns ran at once"
        assert next_start - start >= CAMPAIGN_S / 2 - 0.05, "two campaigns in one slot"

    store = open_ledger(ledger_url)
    echoes = [f for f in store.findings() if f.kind is FindingKind.CROSS_TENANT_ECHO]
    by_replica = {f.record_id.split(".", 1)[0] for f in echoes}
    assert by_replica == {"a", "b"}  # both replicas found the leak ...
    incidents = [i for i in store.incidents() if i.key.kind is FindingKind.CROSS_TENANT_ECHO]
    pairs = {(f.victim_tenant or "", f.observer_tenant) for f in echoes}
    assert {i.key for i in incidents} == {IncidentKey("testbed", FindingKind.CROSS_TENANT_ECHO, v, o)
                                          for v, o in pairs}  # ... and each pair is one incident
    assert sum(i.count for i in incidents) == len(echoes)

    store.close()


def test_a_replica_attributes_what_another_minted(testbed: StartTestbed, postgres: PostgresServer,
                                                  tmp_path: Path) -> None:
    """Replica a runs campaigns; replica b only sentinels, sized over the KV pool, so that its probes are
    answered from the leftover pages of a's campaign prompts.  b knows a's canaries only from the ledger."""
    server = testbed("incident", **SMALL)
    ledger_url = postgres.create_database()
    over_pool = {"tokens": SMALL["pool_tokens"] + 1, "max_tokens": 64}
    observer = {"schedule": {**SCHEDULE, "campaign": "1h"}, "sentinel": over_pool}
    with replica(server.url, ledger_url, "a", tmp_path) as a:
        a.wait_for(lambda: bool(campaigns(a.log_path)), 60, "replica a's first campaign")
        with replica(server.url, ledger_url, "b", tmp_path, **observer) as b:
            store = open_ledger(ledger_url)

            def crossed() -> list[tuple[Canary, Finding]]:
                found = []
                for finding in store.findings():
                    if finding.kind is FindingKind.CROSS_TENANT_ECHO and finding.record_id.startswith("b."):
                        canary = store.get_canary(finding.canary_id or "")
                        if canary is not None and canary.probe_id.startswith("a."):
                            found.append((canary, finding))
                return found

            b.wait_for(lambda: any(c.kind is CanaryKind.FACT for c, _ in crossed()), 90,
                       "replica b to find a fact canary that replica a minted")
            assert b.stop() == 0
        assert a.stop() == 0
    pairs = crossed()
    assert all(f.victim_tenant == c.tenant != f.observer_tenant for c, f in pairs)
    # A fact is attributed whole (exact, fuzzy, semantic) or by its one strong value (fragment, `fact_name`).
    assert {f.detector for c, f in pairs if c.kind is CanaryKind.FACT} <= {"exact", "fuzzy", "semantic", "fragment"}
    store.close()


def test_a_killed_lock_holder_hands_the_job_over(testbed: StartTestbed, postgres: PostgresServer,
                                                 tmp_path: Path) -> None:
    server = testbed("fixed", **{**SMALL, "prefill_ms_per_1k_tokens": 150})  # a campaign takes many seconds
    ledger_url = postgres.create_database()
    with replica(server.url, ledger_url, "a", tmp_path) as a, replica(server.url, ledger_url, "b", tmp_path) as b:
        def running(d: DaemonProcess) -> bool:
            return bool(d.get("/status").json()["targets"][0]["jobs"]["campaign"]["running"])

        a.wait_for(lambda: running(a) or running(b), 60, "a campaign to start")
        holder, other = (a, b) if running(a) else (b, a)
        other.wait_for(lambda: other.sample("leakprobe_job_skips_total", job="campaign", reason="locked") > 0, 30,
                       "the other replica to find the campaign locked")
        holder.signal(signal.SIGKILL)
        holder.wait(30)
        other.wait_for(lambda: bool(campaigns(other.log_path)), 120, "the other replica to run the campaign")
        assert other.stop() == 0
