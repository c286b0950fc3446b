"""What the daemon gives an on-call engineer, driven in this process: incidents that close only on a clean
re-check (and say why), target health from every request (refused, DNS, TLS), series that exist at 0 from
the start, guarded `/status` and `/-/reload`, `leakprobe incidents list|ack`, and `--check-config` reading
every credential.  The same story through a real Prometheus and Alertmanager: tests/test_monitoring.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from prober.daemon import Daemon
from prober.domain.incidents import IncidentKey
from prober.domain.types import FindingKind
from prober.ledger import open_ledger
from prober.targets.result import ErrorKind
from prober.testbed import TestbedServer, build_config
from tests.support.cli import invoke
from tests.support.daemonproc import daemon_config
from tests.support.daemons import make_daemon, sample, scenario, until
from tests.support.ledgers import finding
from tests.support.testbed import SMALL, StartTestbed

pytestmark = pytest.mark.usefixtures("keys_in_env")

TOKEN = "s3cret-token-for-the-tests"
QUIET = {"schedule": {"preflight": "1h", "sentinel": "1h", "campaign": "1h"}}  # only the first runs, at start


# One request of each kind at each boundary: what a re-check needs, in half the time of the full plan.
LEAN = {"streaming": "plain", "concurrent": False}


def lean_daemon(url: str, folder: Path, **daemon: Any) -> Daemon:
    config = {**daemon_config(url, folder / "l.sqlite", **daemon), "detection": {"semantic": False}, "audit": LEAN}
    (folder / "daemon.yaml").write_text(yaml.safe_dump(config))
    return _daemon(folder)


def names(exposition: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(exposition) for s in family.samples}


def alerting(daemon: Daemon, victim: str, observer: str) -> float:
    return sample(daemon, "leakprobe_incident_alerting", kind="cross_tenant_echo", victim=victim, observer=observer)


@pytest.mark.slow
def test_an_incident_stays_open_while_the_leak_persists_and_closes_on_a_clean_recheck(tmp_path: Path) -> None:
    engine = TestbedServer(build_config("incident", SMALL)).start()
    port = engine.port
    daemon = lean_daemon(engine.url, tmp_path, incident_hold="1s", resolved_notice="2s")
    pair = ("tenant-a", "tenant-b")

    async def body(client: httpx.AsyncClient) -> None:
        nonlocal engine
        probe = "leakprobe_incident_check_last_found_timestamp_seconds"
        await until(daemon, lambda: sample(daemon, probe, kind="cross_tenant_echo", job="campaign") > 0,
                    "a campaign to record the probe that found a cross-tenant echo")
        campaigns = sample(daemon, "leakprobe_job_runs_total", job="campaign")
        found = [s for f in daemon.metrics.registry.collect() for s in f.samples if s.name == probe]
        assert found and all(s.labels["boundary"] and s.labels["prompt_tokens"].isdigit() for s in found)
        # Leaking still: campaigns come and go, the hold (1 s) passes many times, the incident stays open.
        def two_more_campaigns() -> bool:
            assert alerting(daemon, *pair) == 1, "closed while the engine still leaks"
            return sample(daemon, "leakprobe_last_run_timestamp_seconds", job="campaign") > 0 and sample(
                daemon, "leakprobe_job_runs_total", job="campaign") >= campaigns + 2
        await until(daemon, two_more_campaigns, "two more campaigns")
        engine.stop()
        engine = TestbedServer(build_config("fixed", SMALL), port=port).start()  # the same address, fixed
        await until(daemon, lambda: alerting(daemon, *pair) == 2, "the clean re-check to close the incident")
        (closed,) = [s for f in daemon.metrics.registry.collect() for s in f.samples
                     if s.name == "leakprobe_incident_closed_timestamp_seconds" and s.labels["victim"] == pair[0]
                     and s.labels["kind"] == "cross_tenant_echo"]
        assert closed.labels["how"] == "rechecked" and closed.labels["job"] == "campaign"
        status = (await client.get("/status")).json()["targets"][0]
        (why,) = [i["closed"]["why"] for i in status["closed_incidents"]
                  if i["kind"] == "cross_tenant_echo" and (i["victim"], i["observer"]) == pair]
        assert why.startswith(f"clean re-check at boundary {closed.labels['boundary']} (campaign job) at ")
        await until(daemon, lambda: alerting(daemon, *pair) == 0, "the resolved notice to end")

    try:
        scenario(daemon, body)
    finally:
        engine.stop()


def test_target_health_comes_from_every_request(testbed: StartTestbed, tmp_path: Path) -> None:
    plain = testbed("fixed", **SMALL)
    unresolvable = "http://leakprobe-test-host.invalid:8000"
    tls = "https://" + plain.url.removeprefix("http://")  # a TLS client on a plain-HTTP port
    config = daemon_config(unresolvable, tmp_path / "l.sqlite", **QUIET)
    config["targets"] = [{"name": name, "url": url + "/v1", "timeout_s": 5, "retries": 0}
                         for name, url in (("nowhere", unresolvable), ("wrong-tls", tls), ("served", plain.url))]
    (tmp_path / "daemon.yaml").write_text(yaml.safe_dump({**config, "detection": {"semantic": False}}))
    daemon = _daemon(tmp_path)

    async def body(client: httpx.AsyncClient) -> None:
        exposition = (await client.get("/metrics")).text
        for kind in ErrorKind:  # at 0 before anything is sent, so increase() sees the first
            wanted = 0 if kind is ErrorKind.REFUSED else 1
            assert exposition.count(f'leakprobe_target_request_errors_total{{kind="{kind}",target="nowhere"}} 0.0') \
                == wanted, kind
        for reason in ("unusable", "plan", "prompt", "ledger", "incomplete"):
            assert f'leakprobe_job_failures_total{{job="campaign",reason="{reason}",target="served"}} 0.0' in exposition
        assert not {n for n in names(exposition) if n.endswith("_created")}
        await until(daemon, lambda: sample(daemon, "leakprobe_job_failures_total", target="wrong-tls") >= 1
                    and sample(daemon, "leakprobe_job_failures_total", target="nowhere") >= 1
                    and sample(daemon, "leakprobe_last_run_timestamp_seconds", target="served", job="sentinel") > 0,
                    "each target's first runs")
        assert sample(daemon, "leakprobe_target_request_errors_total", target="nowhere", kind="dns") >= 1
        assert sample(daemon, "leakprobe_target_request_errors_total", target="wrong-tls", kind="tls") >= 1
        assert sample(daemon, "leakprobe_target_up", target="nowhere") == 0
        assert sample(daemon, "leakprobe_target_up", target="wrong-tls") == 0
        assert sample(daemon, "leakprobe_target_up", target="served") == 1
        assert sample(daemon, "leakprobe_capacity_surveyed_timestamp_seconds", target="served") > 0
        assert sample(daemon, "leakprobe_capacity_surveyed_timestamp_seconds", target="nowhere") == 0
        # A job still running (the served target's first campaign) mints more between the two reads: wait.
        await until(daemon, lambda: sample(daemon, "leakprobe_active_canaries")
                    == len(daemon.ledger.active_canaries()) > 0, "the exported canary count to match the ledger")

    scenario(daemon, body)


def _daemon(folder: Path) -> Daemon:
    from prometheus_client import CollectorRegistry

    from prober.canaries.keys import resolve_key
    from prober.canaries.mint import Minter
    from prober.daemon import load_settings

    settings = load_settings(folder / "daemon.yaml", {})
    ledger = open_ledger(settings.config.ledger)
    return Daemon(settings, Minter(ledger, resolve_key(ledger)), registry=CollectorRegistry())


@pytest.mark.parametrize("status", ["full", "redacted"])
def test_status_and_reload_want_the_token(tmp_path: Path, status: str) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    daemon = make_daemon("http://127.0.0.1:9", tmp_path, **QUIET, token_file=str(token_file), http_reload=True,
                         status=status)
    bearer = {"Authorization": f"Bearer {TOKEN}"}

    async def body(client: httpx.AsyncClient) -> None:
        anonymous = await client.get("/status")
        if status == "full":
            assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Bearer")
        else:
            redacted = anonymous.json()
            assert anonymous.status_code == 200 and redacted["targets"][0]["url"].startswith("(redacted")
            assert "127.0.0.1" not in anonymous.text and str(tmp_path) not in anonymous.text
        assert (await client.get("/status", headers={"Authorization": "Bearer wrong-token-xxxxxxxx"})).status_code \
            == (401 if status == "full" else 200)
        full = await client.get("/status", headers=bearer)
        assert full.status_code == 200 and full.json()["targets"][0]["url"] == "http://127.0.0.1:9/v1"
        assert TOKEN not in full.text
        assert (await client.post("/-/reload")).status_code == 401
        assert sample(daemon, "leakprobe_config_reloads_total") == 0  # refused before anything was read
        assert (await client.post("/-/reload", headers=bearer)).status_code == 200
        assert sample(daemon, "leakprobe_http_refused_total", endpoint="reload", status="401") == 1
        for path in ("/metrics", "/-/healthy", "/-/ready"):
            assert (await client.get(path)).status_code in (200, 503)  # open to Prometheus and the kubelet

    scenario(daemon, body)


def test_reload_over_http_is_off_unless_enabled(tmp_path: Path) -> None:
    daemon = make_daemon("http://127.0.0.1:9", tmp_path, **QUIET)

    async def body(client: httpx.AsyncClient) -> None:
        refused = await client.post("/-/reload")
        assert refused.status_code == 403 and "SIGHUP" in refused.text
        assert sample(daemon, "leakprobe_config_reloads_total") == 0
        assert (await client.get("/status")).status_code == 200  # no token configured: the full document

    scenario(daemon, body)


def write_config(folder: Path, **daemon: Any) -> Path:
    path = folder / "check.yaml"
    path.write_text(yaml.safe_dump(daemon_config("http://127.0.0.1:9", folder / "l.sqlite", **daemon)))
    return path


@pytest.mark.parametrize(("env", "daemon", "complaint"), [
    ({"LP_B": ""}, {}, "LP_B is empty"),
    ({"LEAKPROBE_CANARY_KEY": "short"}, {}, "at least 16 characters"),
    ({}, {"token_file": "/nonexistent/token"}, "cannot read secret file /nonexistent/token"),
])
def test_check_config_exits_2_on_a_missing_or_unusable_credential(tmp_path: Path, env: dict[str, str],
                                                                  daemon: dict[str, Any], complaint: str) -> None:
    result = invoke("daemon", "--config", str(write_config(tmp_path, **daemon)), "--check-config", env=env)
    assert result.exit_code == 2 and complaint in result.output, result.output


def test_check_config_exits_2_when_a_key_variable_is_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LP_B")
    from typer.testing import CliRunner

    from prober.cli import app

    result = CliRunner().invoke(app, ["daemon", "--config", str(write_config(tmp_path)), "--check-config"],
                                env={"LP_A": "testbed-key-a"})
    assert result.exit_code == 2 and "LP_B is not set" in result.output, result.output


def test_check_config_warns_where_a_job_cannot_recheck_within_the_hold(tmp_path: Path) -> None:
    path = write_config(tmp_path, schedule={"preflight": "5m", "sentinel": "1m", "campaign": "6h", "timing": "30m",
                                            "crosstalk": "5m", "shapes": "30m", "prefix-cache": "30m",
                                            "idle-slots": "off", "request-ids": "30m", "abort-retry": "off",
                                            "adapters": "30m", "media-cache": "off", "prompt-embeds": "off"},
                        incident_hold="1h")
    result = invoke("daemon", "--config", str(path), "--check-config")
    assert result.exit_code == 0, result.output
    warned = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "daemon.schedule.campaign" in warned[0] and "incident_hold" in warned[0]


def test_incidents_list_and_ack(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    store = open_ledger(path)
    store.add_findings([finding(found_at=1.7e9)])
    store.close()
    key = IncidentKey("sglang", FindingKind.CROSS_TENANT_ECHO, "alice", "bob")
    listed = invoke("incidents", "list", "--ledger", str(path), "--hold", "100000000d")
    assert listed.exit_code == 0 and "sglang/cross_tenant_echo/alice/bob" in listed.output, listed.output
    acked = invoke("incidents", "ack", "sglang/cross_tenant_echo/alice/bob", "--by", "oncall-ana", "--note",
                   "SEC-1", "--ledger", str(path))
    assert acked.exit_code == 0, acked.output
    assert invoke("incidents", "list", "--ledger", str(path), "--hold", "100000000d").output.count("sglang/") == 0
    every = invoke("incidents", "list", "--all", "--ledger", str(path), "--format", "json")
    (shown,) = yaml.safe_load(every.output)
    assert shown["state"] == "closed" and shown["acknowledged"]["by"] == "oncall-ana"
    assert shown["closed"]["why"].startswith("acknowledged by oncall-ana")
    again = open_ledger(path)
    assert next(i for i in again.incidents() if i.key == key).ack is not None
    again.close()
    for bad, complaint in ((["nowhere/cross_tenant_echo/alice/bob"], "no incident"),
                           (["sglang/no_such_kind/alice/bob"], "unknown finding kind"),
                           (["sglang/cross_tenant_echo/alice/bob", "--by", "two words"], "--by")):
        args = bad if "--by" in bad else [*bad, "--by", "ana"]
        refused = invoke("incidents", "ack", *args, "--ledger", str(path))
        assert refused.exit_code == 2 and complaint in refused.output, refused.output
