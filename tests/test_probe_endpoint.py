"""`/probe`, one check of one target now: what a rollout's webhook gets from the daemon (a Flagger-shaped call over
loopback to a daemon process: 200 for the fixed engine, non-2xx for the incident's), and how it is guarded (in
this process, the daemon's own app over ASGI: the token, another host, one run at a time per target, one per
`probe_every`, the day's budget, names that do not exist), each refusal with its body and its count."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from prober.checks import REGISTRY
from prober.daemon.http import make_app
from prober.daemon.schedule import daemon_jobs
from tests.support.daemonproc import DaemonProcess, daemon_config
from tests.support.daemons import make_daemon, sample, scenario
from tests.support.testbed import SMALL, StartTestbed

pytestmark = pytest.mark.usefixtures("keys_in_env")

# Nothing on the schedule but the survey: every run here is one asked for.
QUIET = {"schedule": {job: "off" for job in daemon_jobs(REGISTRY) if job != "preflight"}}


def flagger(target: str, check: str = "gate") -> dict[str, Any]:
    """What Flagger POSTs to a pre-rollout webhook: the canary's name, namespace and phase, the webhook's metadata."""
    return {"name": "engine", "namespace": "serving", "phase": "Progressing",
            "metadata": {"target": target, "check": check}}


def test_a_flagger_webhook_gets_200_for_the_fixed_engine_and_non_2xx_for_the_incident(testbed: StartTestbed,
                                                                                       tmp_path: Path) -> None:
    fixed, incident = testbed("fixed", **SMALL), testbed("incident", **SMALL)
    config = daemon_config(fixed.url, tmp_path / "l.sqlite", **QUIET)
    config["targets"][0]["name"] = "fixed"
    config["targets"].append({**config["targets"][0], "name": "incident", "url": incident.url + "/v1"})
    with DaemonProcess(config, tmp_path) as daemon:
        passed = httpx.post(daemon.url + "/probe", json=flagger("fixed"), timeout=300)
        failed = httpx.post(daemon.url + "/probe", json=flagger("incident"), timeout=300)
        print(f"/probe fixed: {passed.status_code} {passed.text}\n/probe incident: {failed.status_code} {failed.text}")
        assert passed.status_code == 200 and passed.json()["verdict"] == "pass", passed.text
        assert failed.status_code == 412 and failed.json()["verdict"] == "fail", failed.text
        kinds = {f["kind"] for f in failed.json()["findings"]}
        assert "boundary_accepted" in kinds and failed.json()["tokens"] > 0
        # What it found is the daemon's as any run's: in its metrics, and an incident open.
        assert daemon.sample("leakprobe_on_demand_runs_total", target="incident", job="gate", verdict="fail") == 1
        assert daemon.sample("leakprobe_findings_total", kind="boundary_accepted") > 0


def test_the_guard_and_the_limits(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("fixed", **SMALL)
    token = tmp_path / "token"
    token.write_text("a-token-of-sixteen-or-more\n")
    daemon = make_daemon(server.url, tmp_path, **QUIET, probe_every="1h", token_file=str(token))
    bearer = {"Authorization": "Bearer a-token-of-sixteen-or-more"}

    async def body(client: httpx.AsyncClient) -> None:
        unauthorized = await client.get("/probe", params={"target": "testbed", "check": "gate"})
        assert unauthorized.status_code == 401 and "token" in unauthorized.text
        unknown = await client.get("/probe", params={"target": "nope", "check": "gate"}, headers=bearer)
        assert unknown.status_code == 404 and "testbed" in unknown.text
        no_check = await client.get("/probe", params={"target": "testbed", "check": "nope"}, headers=bearer)
        assert no_check.status_code == 404 and "gate" in no_check.text
        # Two at once: one runs, the other is refused at once.
        first, second = await asyncio.gather(*(client.get("/probe", params={"target": "testbed", "check": "gate"},
                                                          headers=bearer) for _ in range(2)))
        ran, refused = sorted((first, second), key=lambda r: r.status_code)
        assert ran.status_code == 200 and refused.status_code == 429 and "one at a time" in refused.text
        scrape = ran.text
        assert "leakprobe_probe_success 1.0" in scrape and "leakprobe_probe_decided 1.0" in scrape, scrape
        soon = await client.get("/probe", params={"target": "testbed", "check": "gate", "format": "json"},
                                headers=bearer)
        assert soon.status_code == 429 and "daemon.probe_every" in soon.text and soon.headers["retry-after"]
        assert sample(daemon, "leakprobe_http_refused_total", endpoint="probe", status="429") == 2
        assert sample(daemon, "leakprobe_http_refused_total", endpoint="probe", status="401") == 1
        assert sample(daemon, "leakprobe_on_demand_runs_total", verdict="pass") == 1

    scenario(daemon, body)


def test_without_a_token_only_this_host_may_call_it_and_the_budget_holds(testbed: StartTestbed,
                                                                         tmp_path: Path) -> None:
    server = testbed("fixed", **SMALL)
    daemon = make_daemon(server.url, tmp_path, **QUIET, tokens_per_day=1_000)

    async def body(client: httpx.AsyncClient) -> None:
        elsewhere = httpx.ASGITransport(make_app(daemon.endpoints), client=("10.0.0.7", 40000))
        async with httpx.AsyncClient(transport=elsewhere, base_url="http://daemon") as remote:
            refused = await remote.get("/probe", params={"target": "testbed", "check": "gate"})
        assert refused.status_code == 403 and "this host alone" in refused.text
        over = await client.post("/probe", json=flagger("testbed"))
        assert over.status_code == 429 and "budget" in over.text, over.text
        assert sample(daemon, "leakprobe_http_refused_total", endpoint="probe", status="403") == 1
        assert sample(daemon, "leakprobe_http_refused_total", endpoint="probe", status="429") == 1

    scenario(daemon, body)


def test_off_is_off(testbed: StartTestbed, tmp_path: Path) -> None:
    daemon = make_daemon(testbed("fixed", **SMALL).url, tmp_path, **QUIET, probe_every="off")

    async def body(client: httpx.AsyncClient) -> None:
        off = await client.get("/probe", params={"target": "testbed", "check": "gate"})
        assert off.status_code == 403 and "daemon.probe_every" in off.text

    scenario(daemon, body)
