"""`leakprobe daemon` as a subprocess against the reference engine: metrics, health, incidents, budget,
reload, SIGTERM and SIGKILL."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from prober.checks import REGISTRY
from prober.daemon.budget import utc_day
from prober.domain.evidence import EngineCounters
from prober.ledger import open_ledger
from tests.support.crash import assert_nothing_lost, kill_at_random_moment, printed_findings
from tests.support.daemonproc import DaemonProcess, daemon_config
from tests.support.keys import KEYS
from tests.support.pool import NewCanaries, ledger_key, sent_canaries
from tests.support.testbed import SMALL, StartTestbed
from tests.support.tools import need

LEAKS = {"cross_tenant_echo", "boundary_accepted", "placeholder_substitution", "foreign_content"}
HEALTHY = {"context_length": 4_096, "pool_tokens": 16_384, "page_size": 16, "prefill_ms_per_1k_tokens": 0}


def succeeded(daemon: DaemonProcess, job: str) -> bool:
    return daemon.get("/status").json()["targets"][0]["jobs"][job]["last_success"] is not None


def echoes(daemon: DaemonProcess, victim: str, observer: str) -> float:
    return daemon.sample("leakprobe_findings_total", kind="cross_tenant_echo", victim=victim, observer=observer)


def test_incident_is_caught_exported_and_survives_a_restart(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("incident", **SMALL, reports_version="0.5.11")  # an SGLang release the incident's bug is in
    ledger = tmp_path / "l.sqlite"
    with DaemonProcess(daemon_config(server.url, ledger), tmp_path) as daemon:
        daemon.wait_for(lambda: echoes(daemon, "tenant-a", "tenant-b") > 0 and echoes(daemon, "tenant-b", "tenant-a")
                        > 0, 60, "cross-tenant echoes both ways")
        daemon.wait_for(lambda: all(succeeded(daemon, job) for job in ("preflight", "sentinel", "campaign")), 30,
                        "every job to succeed")
        assert daemon.sample("leakprobe_findings_total", kind="boundary_accepted") > 0
        assert daemon.sample("leakprobe_capacity_verdict", verdict="capacity_inversion") == 1
        assert daemon.sample("leakprobe_engine_info", engine="sglang", release="0.5.11") == 1
        assert daemon.sample("leakprobe_engine_known_bug", bug="SGLang #30233, #38704, #38935", standing="applies") == 1
        assert daemon.sample("leakprobe_engine_cache_enabled", layer="prefix") == 1  # said on
        assert daemon.sample("leakprobe_engine_cache_enabled", layer="prefix-tier2") == 0  # said off
        assert daemon.sample("leakprobe_target_advertised_context_tokens") == SMALL["context_length"]
        assert daemon.sample("leakprobe_target_kv_pool_tokens") == SMALL["pool_tokens"]
        assert daemon.sample("leakprobe_boundary_last_outcome", boundary="pool+1") == 3  # served over the limit
        assert daemon.sample("leakprobe_incident_open", kind="cross_tenant_echo", victim="tenant-a",
                             observer="tenant-b") == 1
        assert daemon.get("/-/healthy").status_code == 200 and daemon.get("/-/ready").status_code == 200
        status = daemon.get("/status").json()
        open_pairs = {(i["victim"], i["observer"]) for t in status["targets"] for i in t["open_incidents"]
                      if i["kind"] == "cross_tenant_echo"}
        assert open_pairs == {("tenant-a", "tenant-b"), ("tenant-b", "tenant-a")}
        assert all(status["targets"][0]["jobs"][job]["next_run"] for job in ("preflight", "sentinel", "campaign"))
        exposition = daemon.scrape()
        assert daemon.stop() == 0
    promtool = need("promtool")
    lint = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    store = open_ledger(ledger)
    evidence = [f.evidence_of(EngineCounters) for f in store.findings() if f.kind.value == "cross_tenant_echo"]
    aborts = [e.changes["sglang:num_aborted_requests_total"].delta for e in evidence if e is not None]
    assert aborts and max(aborts) >= 1  # the engine's own abort counter moved around the leak
    logged = printed_findings((tmp_path / "daemon.log").read_text().splitlines())
    stored = {(f.kind.value, f.record_id, f.canary_id) for f in store.findings()}
    assert logged and logged <= stored
    store.close()
    # A restarted daemon reports the open incident before it has probed anything.
    quiet = daemon_config(server.url, ledger, schedule={"preflight": "1h", "sentinel": "1h", "campaign": "1h"})
    with DaemonProcess(quiet, tmp_path, name="restarted") as again:
        assert again.sample("leakprobe_incident_open", kind="cross_tenant_echo", victim="tenant-b",
                            observer="tenant-a") == 1
        assert again.sample("leakprobe_last_finding_timestamp_seconds", kind="cross_tenant_echo") > 0
        assert again.stop() == 0


@pytest.mark.slow
@pytest.mark.parametrize(("preset", "overrides"), [("fixed", SMALL), ("healthy", HEALTHY)])
def test_fixed_and_healthy_stay_clean_over_full_cycles(testbed: StartTestbed, tmp_path: Path, preset: str,
                                                       overrides: dict[str, Any]) -> None:
    server = testbed(preset, **overrides)
    with DaemonProcess(daemon_config(server.url, tmp_path / "l.sqlite"), tmp_path) as daemon:
        daemon.wait_for(lambda: daemon.sample("leakprobe_job_runs_total", job="campaign") >= 2
                        and succeeded(daemon, "campaign"), 90, "two campaigns")
        for job in ("preflight", "sentinel", "campaign"):
            assert succeeded(daemon, job), job
        for kind in LEAKS:
            assert daemon.sample("leakprobe_findings_total", kind=kind) == 0, (kind, daemon.log()[-2000:])
        assert daemon.sample("leakprobe_job_failures_total") == 0, daemon.log()[-2000:]
        # The day each job's last plan adds up to at its interval (the tests' schedule is seconds, not hours).
        day = sum(daemon.sample("leakprobe_job_planned_tokens", job=c.name) * 86_400
                  / (daemon.sample("leakprobe_job_interval_seconds", job=c.name) or 1) for c in REGISTRY)
        assert daemon.sample("leakprobe_token_budget_projected_tokens") == pytest.approx(day, rel=1e-6)
        assert daemon.sample("leakprobe_job_tokens_sent_total", job="campaign") > 0
        assert daemon.stop() == 0
    assert not [f for f in open_ledger(tmp_path / "l.sqlite").findings() if f.kind.value in LEAKS]


@pytest.mark.slow
def test_budget_skips_the_campaign_keeps_sentinels_and_survives_a_restart(testbed: StartTestbed,
                                                                           tmp_path: Path) -> None:
    server = testbed("fixed", **SMALL)
    ledger = tmp_path / "l.sqlite"
    config = daemon_config(server.url, ledger, tokens_per_day=6_000)  # a campaign needs ~180,000
    with DaemonProcess(config, tmp_path) as daemon:
        daemon.wait_for(lambda: daemon.sample("leakprobe_job_skips_total", job="campaign", reason="budget") >= 1
                        and succeeded(daemon, "sentinel"), 30, "a skipped campaign and a sentinel")
        assert daemon.sample("leakprobe_probes_total", job="campaign") == 0  # never half-run
        assert "campaign testbed: skipped (budget)" in daemon.log()
        # The preflight planned every job: the day they add up to is over the budget, and the log says so once.
        planned = daemon.sample("leakprobe_job_planned_tokens", job="campaign")
        assert planned > 6_000 and daemon.sample("leakprobe_token_budget_projected_tokens") > planned
        assert daemon.log().count("over daemon.tokens_per_day (6,000): jobs will be skipped for budget") == 1
        assert daemon.stop() == 0
    store = open_ledger(ledger)
    spent = store.tokens_spent("testbed", utc_day())
    store.close()
    assert 0 < spent <= 6_000
    with DaemonProcess(config, tmp_path, name="restarted") as again:
        assert again.sample("leakprobe_token_budget_remaining_tokens") <= 6_000 - spent  # remembered
        again.wait_for(lambda: again.sample("leakprobe_job_skips_total", job="sentinel", reason="budget") >= 1, 30,
                       "the sentinels to run out of budget too")
        assert again.stop() == 0


def test_a_campaign_over_its_share_of_the_budget_is_paced_not_skipped(testbed: StartTestbed, tmp_path: Path) -> None:
    """The campaign on its default schedule, a budget whose tenth it outgrows: it runs once, then once in the
    interval its plan fits a tenth of the day in, and the day projected is that tenth."""
    server = testbed("fixed", **SMALL)
    others = {check.name: "off" for check in REGISTRY if check.name != "campaign"}
    config = daemon_config(server.url, tmp_path / "l.sqlite", tokens_per_day=400_000, job_share=0.1,
                           schedule={**others, "preflight": "2s"}, incident_hold="7h")
    with DaemonProcess(config, tmp_path) as daemon:
        daemon.wait_for(lambda: succeeded(daemon, "campaign"), 60, "the first campaign")
        planned = daemon.sample("leakprobe_job_planned_tokens", job="campaign")
        paced = planned * 86_400 / 40_000
        assert planned > 40_000 * 21_600 / 86_400  # over its tenth at 6 h, so paced
        assert daemon.sample("leakprobe_job_interval_seconds", job="campaign") == pytest.approx(paced)
        assert daemon.sample("leakprobe_token_budget_projected_tokens") == pytest.approx(40_000, abs=1)
        assert "campaign testbed: every " in daemon.log() and "(was 6.0 h)" in daemon.log()
        # 6 h fits a 7 h hold, so the start said nothing of it; the paced interval does not.
        held = [line for line in daemon.log().splitlines() if "longer than daemon.incident_hold" in line]
        assert len(held) == 1 and "testbed: paced, daemon.schedule.campaign (" in held[0], held
        job = daemon.get("/status").json()["targets"][0]["jobs"]["campaign"]
        assert job["next_run"] - job["last_run"] >= paced * 0.99  # its next run a paced interval on
        assert daemon.sample("leakprobe_job_runs_total", job="campaign") == 1
        # Handed over when due: the scheduler's lag, its jitter aside, is well under a second on an idle daemon.
        assert daemon.sample("leakprobe_job_start_lag_seconds_count", job="campaign") == 1
        assert daemon.sample("leakprobe_job_start_lag_seconds_sum", job="campaign") < 1
        assert daemon.sample("leakprobe_job_skips_total", job="campaign", reason="budget") == 0
        assert daemon.stop() == 0


def test_reload_applies_a_valid_config_and_refuses_an_invalid_one(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("fixed", **SMALL)
    config = daemon_config(server.url, tmp_path / "l.sqlite", http_reload=True)
    with DaemonProcess(config, tmp_path) as daemon:
        assert daemon.sample("leakprobe_job_interval_seconds", job="sentinel") == 1
        config["daemon"]["schedule"]["sentinel"] = "3s"
        daemon.write_config(config)
        daemon.signal(signal.SIGHUP)
        daemon.wait_for(lambda: daemon.sample("leakprobe_job_interval_seconds", job="sentinel") == 3, 10,
                        "SIGHUP to apply the new interval")
        assert daemon.sample("leakprobe_config_reloads_total") == 1
        daemon.config_path.write_text(daemon.config_path.read_text() + "\nsurprise: 1\n")
        refused = daemon.post("/-/reload")
        assert refused.status_code == 400 and "surprise" in refused.text
        assert daemon.sample("leakprobe_config_reload_failures_total") == 1
        assert daemon.sample("leakprobe_config_last_reload_successful") == 0
        assert daemon.get("/status").json()["last_reload_error"]
        runs = daemon.sample("leakprobe_job_runs_total", job="sentinel")
        daemon.wait_for(lambda: daemon.sample("leakprobe_job_runs_total", job="sentinel") > runs, 15,
                        "the old config to keep running")
        assert daemon.sample("leakprobe_job_interval_seconds", job="sentinel") == 3
        assert daemon.stop() == 0


@pytest.mark.slow
def test_sigterm_mid_campaign_exits_zero_within_the_grace(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("fixed", **{**SMALL, "prefill_ms_per_1k_tokens": 150})  # a campaign takes ~30 s
    config = daemon_config(server.url, tmp_path / "l.sqlite", shutdown_grace="5s")
    with DaemonProcess(config, tmp_path) as daemon:
        daemon.wait_for(lambda: daemon.get("/status").json()["targets"][0]["jobs"]["campaign"]["running"]
                        and daemon.sample("leakprobe_probes_total", job="campaign") >= 2, 60, "a campaign under way")
        started = time.monotonic()
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
        took = time.monotonic() - started  # the grace, and the moment a cancelled request takes to end
        assert took < 5 + 3, (took, daemon.log()[-6000:].splitlines())
        assert "stopped" in daemon.log() and "cancelled at shutdown" in daemon.log()
        assert "Traceback" not in daemon.log() and "CancelledError" not in daemon.log()


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("incident", **{**SMALL, "prefill_ms_per_1k_tokens": 2})
    ledger = tmp_path / "l.sqlite"
    rng = random.Random(20261130)
    for trial in range(3):
        daemon = DaemonProcess(daemon_config(server.url, ledger), tmp_path, name=f"trial{trial}").start()
        sending = NewCanaries(server, ledger, sent_canaries(server, ledger_key(ledger)))
        # A kill before this process sent anything would prove nothing: wait until it has sent canaries of
        # its own, then kill at a random moment of what follows, at once if a request is in flight then.
        daemon.wait_for(sending, 60, "the daemon to send canaries")
        kill_at_random_moment(server, rng.uniform(0.0, 3.0), partial(daemon.signal, signal.SIGKILL))
        daemon.wait(10)
        assert_nothing_lost(server, ledger, sending, daemon.lines, f"trial {trial}")


def test_check_config_and_startup_errors(tmp_path: Path) -> None:
    def daemon_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "prober", "daemon", *args], capture_output=True, text=True,
                              env={**KEYS, "PATH": "/usr/bin:/bin"}, timeout=60)

    good = tmp_path / "good.yaml"
    good.write_text(json.dumps(daemon_config("http://127.0.0.1:9", tmp_path / "l.sqlite")))
    ok = daemon_cli("--config", str(good), "--check-config")
    assert ok.returncode == 0 and "valid" in ok.stdout, ok.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace('"1s"', '"soon"'))
    refused = daemon_cli("--config", str(bad), "--check-config")
    assert refused.returncode == 2 and "daemon.schedule.sentinel" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    alone = tmp_path / "alone.yaml"
    alone.write_text(good.read_text().replace(', {"name": "tenant-b", "api_key_env": "LP_B"}', ""))
    assert daemon_cli("--config", str(alone), "--check-config").returncode == 2
    missing = subprocess.run([sys.executable, "-m", "prober", "daemon", "--config", str(good)], capture_output=True,
                             text=True, env={"LP_A": "key-of-a", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert missing.returncode == 2 and "LP_B is not set" in missing.stderr
    busy = tmp_path / "busy.yaml"
    with socket_taken() as port:
        busy.write_text(good.read_text().replace("127.0.0.1:0", f"127.0.0.1:{port}"))
        taken = daemon_cli("--config", str(busy))
    assert taken.returncode == 2 and "cannot listen" in taken.stderr and "Traceback" not in taken.stderr


@contextmanager
def socket_taken() -> Iterator[int]:
    """A loopback port held open for the duration."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])
