"""The daemon driven in this process, on its own registry, its HTTP app served over an in-process transport:
what jobs export, what `/status` and `/-/ready` say, reload refusals, and a ledger file deleted or replaced
under it (the subprocess tests in test_daemon.py cover signals, restarts and kills)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from prober.config.schema import TargetConfig
from prober.daemon import Daemon, housekeeping, jobs, service
from prober.ledger import open_ledger
from prober.probing.path import PathOverhead
from prober.probing.routes import Route, Routes
from prober.prompts.counter import LocalCounter
from prober.targets.api import Api
from prober.targets.transport import Transport
from tests.support.daemons import make_daemon, sample, scenario, until
from tests.support.hostile import endless_stream, hostile_engine
from tests.support.testbed import SMALL, StartTestbed

pytestmark = pytest.mark.usefixtures("keys_in_env")


async def leak_recorded(daemon: Daemon) -> list[str]:
    """Once the daemon has found a cross-tenant echo: the canaries of every finding in its ledger."""
    await until(daemon, lambda: sample(daemon, "leakprobe_findings_total", kind="cross_tenant_echo") > 0,
                "a cross-tenant echo")
    return [f.canary_id or "" for f in daemon.ledger.findings()]


def delete_ledger_files(folder: Path) -> None:
    """The ledger and its -wal, -shm files, as a careless clean-up would."""
    for path in folder.glob("l.sqlite*"):
        if path.is_file():
            path.unlink()


@pytest.mark.slow
def test_jobs_export_findings_status_and_readiness(testbed: StartTestbed, tmp_path: Path) -> None:
    server = testbed("incident", **SMALL)
    daemon = make_daemon(server.url, tmp_path, http_reload=True)

    async def body(client: httpx.AsyncClient) -> None:
        await until(daemon, lambda: sample(daemon, "leakprobe_findings_total", kind="cross_tenant_echo") > 0
                    and sample(daemon, "leakprobe_last_run_timestamp_seconds", job="campaign") > 0,
                    "a campaign that found a cross-tenant echo")
        await daemon.housekeep()
        scrape = (await client.get("/metrics")).text
        assert 'leakprobe_findings_total{kind="cross_tenant_echo"' in scrape
        assert (await client.get("/-/ready")).status_code == 200
        status = (await client.get("/status")).json()
        assert status["ready"] and status["not_ready_because"] is None
        jobs = status["targets"][0]["jobs"]
        assert set(jobs) >= {"preflight", "sentinel", "campaign"} and jobs["campaign"]["last_success"]
        assert {i["kind"] for i in status["targets"][0]["open_incidents"]} >= {"cross_tenant_echo"}
        assert "testbed-key" not in (await client.get("/status")).text

        refused = await client.post("/-/reload", content=b"x" * 1000)
        assert refused.status_code == 413 and sample(daemon, "leakprobe_config_reloads_total") == 0
        (tmp_path / "daemon.yaml").write_text("targets: []\n")  # invalid: the old config keeps running
        bad = await client.post("/-/reload")
        assert bad.status_code == 400 and "targets" in bad.text
        assert sample(daemon, "leakprobe_config_last_reload_successful") == 0
        assert (await client.get("/status")).json()["last_reload_error"]

    scenario(daemon, body)


@pytest.mark.unit
def test_jobs_waiting_for_a_route_take_the_measurement_that_a_survey_overtook() -> None:
    """A target's jobs wait for its route while one of them measures the path; a survey (the preflight's) replaces
    the route meanwhile, counting the same way.  The measurement, newer than that survey, serves every job that
    waited: measured once, not once per job.  (On a busy machine a measurement took longer than the tests'
    two-second preflight, and each job measured again in turn: a one-second sentinel waited a minute.)"""
    def words(text: str) -> int:
        return len(text.split())

    async def main() -> tuple[int, list[Route]]:
        measured = 0
        async with Transport() as transport:
            def survey() -> None:
                routes.surveyed(LocalCounter(words), None, None)

            async def measure(route: Route) -> PathOverhead:
                nonlocal measured
                measured += 1
                survey()  # the preflight's survey lands while the path is measured
                await asyncio.sleep(0)
                return PathOverhead.measured(route.api, {"tenant-a": [7]})

            routes = Routes(TargetConfig(name="t", url="http://127.0.0.1:9/v1"), transport, measure)
            survey()
            waited = await asyncio.gather(*(routes.get(Api.CHAT) for _ in range(3)))
            later = await routes.get(Api.CHAT)
            return measured, [*waited, later]

    measured, routes = asyncio.run(main())
    assert measured == 1 and [r.path.high("tenant-a") for r in routes] == [7] * 4, measured


class SentinelWatch:
    """The reference engine's sentinel's successes as each is first seen, and those seen while one of the hostile
    target's jobs was running, at the look before and at the look after: not held behind them."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.successes: list[float] = []
        self.while_held: list[float] = []
        self._held = False

    def look(self) -> float:
        """The latest success, noted."""
        held = any(s.running for s in self.daemon.records.by_target.get("hostile", {}).values())
        success = sample(self.daemon, "leakprobe_last_success_timestamp_seconds", target="testbed", job="sentinel")
        if not self.successes or success != self.successes[-1]:
            if self.successes and held and self._held:
                self.while_held.append(success)
            self.successes.append(success)
        self._held = held
        return success


@pytest.mark.slow
def test_a_target_that_never_finishes_holds_no_job_and_delays_no_other(testbed: StartTestbed, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside the reference engine, a target that answers every generation request with a chunk a second for ever:
    its requests are cut at their own bounds and exported, the job whose deadline passes first (derived from its
    plan, with a base of 1 s for that target instead of 2 minutes) fails for that reason and is not held, its
    sentinel runs again, and the reference engine's sentinel, on its one-second schedule, never fails and keeps
    succeeding meanwhile, also while the hostile target's jobs are held.  (Its own jobs keep the product's base: on
    a busy machine one second is not enough for a healthy engine's run, and that is not what this is about.)"""
    def sessions(config: TargetConfig, *args: Any, **kwargs: Any) -> jobs.TargetSession:
        session = jobs.TargetSession(config, *args, **kwargs)
        if config.name == "hostile":
            session.deadline_base_s = 1.0
        return session

    monkeypatch.setattr(service, "TargetSession", sessions)
    server = testbed("healthy", **SMALL)
    with hostile_engine(chat=endless_stream) as hostile:
        daemon = make_daemon(server.url, tmp_path, sentinel={"max_tokens": 8}, audit={"max_tokens": 8}, targets=[
            {"name": "hostile", "url": hostile.url + "/v1", "timeout_s": 2, "retries": 0, "breaker": 3}])
        watch = SentinelWatch(daemon)

        def cut_and_run_again() -> bool:
            watch.look()
            return (sample(daemon, "leakprobe_requests_cut_total", target="hostile", reason="deadline") > 0
                    and sample(daemon, "leakprobe_job_failures_total", target="hostile", reason="deadline") > 0
                    and sample(daemon, "leakprobe_job_failures_total", target="hostile", job="sentinel") >= 2
                    and len(watch.while_held) >= 2)

        async def body(client: httpx.AsyncClient) -> None:
            await until(daemon, cut_and_run_again, "the hostile target's requests cut and its sentinel run twice, "
                        "and the reference engine's sentinel succeeding while the hostile target's jobs were held",
                        cap_s=600)
            last = watch.successes[-1]
            await until(daemon, lambda: watch.look() > last, "the reference engine's sentinel's next success")
            scrape = (await client.get("/metrics")).text
            assert 'leakprobe_requests_cut_total{reason="deadline",target="hostile"}' in scrape
            status = (await client.get("/status")).json()
            hostile_jobs = next(t for t in status["targets"] if t["name"] == "hostile")["jobs"]
            assert any((j["last_error"] or "").startswith("deadline: ") for j in hostile_jobs.values()), hostile_jobs
            assert sample(daemon, "leakprobe_job_failures_total", target="testbed", job="sentinel") == 0

        scenario(daemon, body)
    assert hostile.seen


@pytest.fixture
def leaking(testbed: StartTestbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Daemon:
    """A daemon against the incident engine whose housekeeping (which restores a deleted ledger) the test
    runs itself, at the moment it chooses."""
    monkeypatch.setattr(housekeeping, "EVERY_S", 3600.0)
    return make_daemon(testbed("incident", **SMALL).url, tmp_path)


@pytest.mark.slow
def test_a_deleted_ledger_pauses_probing_and_is_written_back(leaking: Daemon, tmp_path: Path) -> None:
    daemon, ledger = leaking, tmp_path / "l.sqlite"
    recorded: list[str] = []

    async def body(client: httpx.AsyncClient) -> None:
        recorded.extend(await leak_recorded(daemon))
        delete_ledger_files(tmp_path)
        ready = await client.get("/-/ready")
        assert ready.status_code == 503 and "deleted while open" in ready.text
        assert sample(daemon, "leakprobe_ledger_up") == 0
        # The exchange in flight finishes (its canaries went to the copy the process holds); then nothing.
        await until(daemon, lambda: not any(s.running for jobs in daemon.records.by_target.values()
                                            for s in jobs.values()), "running jobs to stop")
        sent = sample(daemon, "leakprobe_tokens_sent_total")
        skipped = sample(daemon, "leakprobe_job_skips_total", job="sentinel", reason="ledger")
        # Two of the sentinel's slots come and go (the first may have been under way): nothing is sent meanwhile.
        await until(daemon, lambda: sample(daemon, "leakprobe_job_skips_total", job="sentinel", reason="ledger")
                    >= skipped + 2, "the sentinel's next two slots skipped for the ledger")
        assert sample(daemon, "leakprobe_tokens_sent_total") == sent
        await daemon.housekeep()  # the round after it was noticed writes the open copy back
        assert ledger.is_file() and (await client.get("/-/ready")).status_code == 200
        assert sample(daemon, "leakprobe_ledger_recoveries_total") == 1

    scenario(daemon, body)
    restored = open_ledger(ledger)
    assert set(recorded) <= {f.canary_id or "" for f in restored.findings()}  # nothing recorded was lost
    restored.close()


def test_a_replaced_ledger_is_never_overwritten_and_the_open_copy_is_kept(leaking: Daemon, tmp_path: Path) -> None:
    daemon, ledger = leaking, tmp_path / "l.sqlite"
    recorded: list[str] = []

    async def body(client: httpx.AsyncClient) -> None:
        recorded.extend(await leak_recorded(daemon))
        other = tmp_path / "other.sqlite"
        sqlite3.connect(other).execute("CREATE TABLE someone_elses (x)").connection.commit()
        delete_ledger_files(tmp_path)
        other.rename(ledger)
        ready = await client.get("/-/ready")
        assert ready.status_code == 503 and "replaced by another file" in ready.text
        await daemon.housekeep()
        assert (await client.get("/-/ready")).status_code == 503  # someone else's file is left alone

    scenario(daemon, body)
    assert sqlite3.connect(ledger).execute("SELECT name FROM sqlite_master").fetchall() == [("someone_elses",)]
    (aside,) = tmp_path.glob("l.sqlite.orphaned-*")
    kept = open_ledger(aside)
    assert set(recorded) <= {f.canary_id or "" for f in kept.findings()}
    kept.close()
