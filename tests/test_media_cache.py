"""The media-cache check as the daemon runs it: a job of its own whose findings, probes and incidents are exported
under `job="media-cache"`, and whose incidents close on its own clean re-check, at the boundary that found them,
once the engine no longer serves one tenant's image to another.  (Each media fault against an audit, with and
without it: tests/test_engine_bugs.py; the pieces: tests/test_media.py.)"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from prober.daemon import Daemon
from prober.testbed import TestbedServer, build_config
from tests.support.daemons import make_daemon, sample, scenario, until
from tests.support.testbed import SMALL

pytestmark = pytest.mark.usefixtures("keys_in_env")

# The media-cache job alone, every second (the preflight surveys once, at start).
ALONE = {"preflight": "1h", "sentinel": "off", "shapes": "off", "campaign": "off", "prefix-cache": "off",
         "timing": "off", "idle-slots": "off", "crosstalk": "off", "media-cache": "1s"}


def alerting(daemon: Daemon, kind: str) -> float:
    return sample(daemon, "leakprobe_incident_alerting", kind=kind, victim="tenant-a", observer="tenant-b")


def test_a_media_leak_is_a_media_cache_incident_that_closes_on_its_clean_recheck(tmp_path: Path) -> None:
    engine = TestbedServer(build_config("fixed", {**SMALL, "faults": {"media_cache_trusts_uuid": True}})).start()
    port = engine.port
    daemon = make_daemon(engine.url, tmp_path, schedule=ALONE, incident_hold="1s", resolved_notice="1s")

    async def body(client: httpx.AsyncClient) -> None:
        nonlocal engine
        found = "leakprobe_incident_check_last_found_timestamp_seconds"
        await until(daemon, lambda: sample(daemon, found, kind="cross_tenant_echo", job="media-cache") > 0,
                    "the media-cache job to find a cross-tenant echo")
        assert alerting(daemon, "cross_tenant_echo") == 1
        boundaries = {s.labels["boundary"] for f in daemon.metrics.registry.collect() for s in f.samples
                      if s.name == found and s.labels["job"] == "media-cache"}
        assert boundaries <= {"media-uuid-reuse", "media-uuid-only"} and boundaries, boundaries
        assert sample(daemon, "leakprobe_probes_total", job="media-cache", boundary="media-uuid-reuse",
                      outcome="served") >= 2
        engine.stop()
        engine = TestbedServer(build_config("fixed", SMALL), port=port).start()  # the same address, fixed
        await until(daemon, lambda: alerting(daemon, "cross_tenant_echo") == 2, "a clean media re-check to close it")
        status = (await client.get("/status")).json()["targets"][0]
        (closed,) = [i["closed"] for i in status["closed_incidents"] if i["kind"] == "cross_tenant_echo"
                     and (i["victim"], i["observer"]) == ("tenant-a", "tenant-b")]
        assert closed["how"] == "rechecked" and "(media-cache job)" in closed["why"], closed
        assert sample(daemon, "leakprobe_probes_total", job="media-cache", boundary="media-uuid-only",
                      outcome="refused") >= 2  # the fixed engine refuses another tenant's uuid alone

    try:
        scenario(daemon, body)
    finally:
        engine.stop()
