"""Every check's incident closes by that check: for each check of the registry, a daemon running it against the
reference engine with the engine bug that check catches (its `bugs`; a check the table names nowhere takes what
every answer shows, and the `shapes` job runs beside it, as the controls find that too) opens incidents; the
engine restarted at the same address without the fault, the check's next run re-checks them clean, and each closes,
once, by a clean re-check: `leakprobe_incident_alerting` leaves 1 within the check's period and the hold, after one
run (a timing run that leaves a pair undecided is no re-check, and does not count)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from prober.canaries.keys import KEY_ENV
from prober.checks import REGISTRY, Check
from prober.checks.bugs import EngineBug
from prober.daemon import Daemon
from prober.daemon.schedule import daemon_jobs
from prober.domain.incidents import RunChecks, Sighting
from prober.domain.types import FindingKind, ProbeContext, Severity
from prober.ledger import open_ledger
from prober.testbed import TestbedServer, build_config
from tests.support.daemons import make_daemon, sample, scenario, until
from tests.support.ledgers import finding
from tests.support.testbed import DEPLOYMENT_KEY, bug_engine

pytestmark = pytest.mark.usefixtures("keys_in_env")

PERIOD = "1s"
RUNS_TO_FIND = 3  # a check's runs against its bug before it must have found it
# Each check at its smallest that still catches its bug (abort-retry's prompt spans the engine's prefill chunks, so
# that a hang-up lands between two).
SECTIONS = {"timing": {"samples": 8, "rounds": 3, "prompt_tokens": 64}, "crosstalk": {"per_tenant": 2},
            "request-ids": {"groups": 1}, "abort-retry": {"tokens": 4_096}, "adapters": {"per_tenant": 1},
            "media-cache": {"hash_bits": 8}}
# What a check needs of the engine beyond its bug: timing measures prefill, which the small engine does not simulate.
ENGINE = {"timing": {"prefill_ms_per_1k_tokens": 1_000}}
# Cases measured over 8 s on 2 cores (a campaign's long prompts, a prefill long enough to hang up in, timing's samples).
LONG = {"campaign", "abort-retry", "timing"}
FOUND = "leakprobe_incident_check_last_found_timestamp_seconds"
CLEAN = "leakprobe_incident_check_last_clean_timestamp_seconds"
CLOSED = "leakprobe_incident_closed_timestamp_seconds"
UNDECIDED = "leakprobe_cache_timing_undecided"

Key = tuple[str, str, str]  # kind, victim, observer
BUGS = REGISTRY.bugs


def fault_of(check: Check) -> EngineBug:
    """The first engine bug the check's runs catch; a check the table names nowhere takes what every answer shows."""
    return ([b for b in BUGS if check.name in b.checks] or [b for b in BUGS if not b.checks])[0]


@pytest.mark.unit
def test_the_bug_table_names_registered_checks() -> None:
    """Each check's rows name it among the checks that catch them; the rows no check owns name none."""
    assert {name for bug in BUGS for name in bug.checks} <= {check.name for check in REGISTRY}
    assert all(check.name in bug.checks for check in REGISTRY for bug in check.bugs)
    assert not [bug for bug in BUGS if not bug.checks and any(bug in check.bugs for check in REGISTRY)]


def series(daemon: Daemon, name: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(s.labels), s.value) for f in daemon.metrics.registry.collect() for s in f.samples if s.name == name]


def key_of(labels: dict[str, str]) -> Key:
    return labels["kind"], labels["victim"], labels["observer"]


class Runs:
    """A job's runs since the fix, as the test sees them end: how many began, and how many left a tenant pair
    undecided (timing's, which re-check nothing)."""

    def __init__(self, daemon: Daemon, job: str) -> None:
        self.daemon, self.job = daemon, job
        self.began = self._began()
        self.ended = self._ended()
        self.undecided = 0

    def _began(self) -> float:
        return sample(self.daemon, "leakprobe_job_runs_total", job=self.job)

    def _ended(self) -> float:
        return sample(self.daemon, "leakprobe_last_run_timestamp_seconds", job=self.job)

    def poll(self) -> None:
        if (ended := self._ended()) != self.ended:
            self.ended = ended
            self.undecided += sample(self.daemon, UNDECIDED) > 0

    @property
    def late(self) -> bool:
        """More runs began than the one under way at the fix, the first after it (which re-checks), the next (which
        may begin before the first's re-check is read here), and the undecided ones."""
        return self._began() - self.began > 2 + self.undecided


def alerts(daemon: Daemon, keys: set[Key]) -> dict[Key, float]:
    return {key_of(labels): value for labels, value in series(daemon, "leakprobe_incident_alerting")
            if key_of(labels) in keys}


def closings(daemon: Daemon, keys: set[Key]) -> dict[Key, tuple[str, str, float]]:
    return {key_of(labels): (labels["how"], labels["job"], value) for labels, value in series(daemon, CLOSED)
            if key_of(labels) in keys}


@pytest.mark.parametrize("name", [pytest.param(c.name, marks=pytest.mark.slow) if c.name in LONG else c.name
                                  for c in REGISTRY])
def test_every_checks_incident_closes_by_that_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    name: str) -> None:
    bug = fault_of(REGISTRY.get(name))
    # The probe shape's controls (which a check runs first where none was chosen) are the `shapes` check's: where
    # every answer shows the bug they find it too, and its job re-checks them.  Elsewhere it stays off, as its
    # requests beside a check's would set that check's counter windows aside.
    closes_by(tmp_path, monkeypatch, name, bug, [name] if bug.checks else list(dict.fromkeys((name, "shapes"))))


def test_controls_found_at_fault_are_rechecked_by_the_next_run_where_shapes_is_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sentinel's run chose the probe shape with controls that every answer's fault marks; with the `shapes` job
    off, the sentinel's next run chooses again, and that re-checks them (else they stay open until acknowledged)."""
    garbled = next(b for b in BUGS if b.kind is FindingKind.GARBLED_OUTPUT)
    rows = closes_by(tmp_path, monkeypatch, "sentinel", garbled, ["sentinel"])
    assert any(job == "shapes" for _, job, _ in rows), rows


def test_foreign_text_a_cache_check_found_closes_by_its_clean_recheck(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The response-cache check's prompts carry no canary, but a garbled engine's answers to them may hold text their
    prompt cannot explain (`foreign_content`, what only content shows).  Its answers say back their prompt's nonce, so
    a clean run of it re-checks that too; else such an incident, found by it alone, would never close."""
    monkeypatch.setenv(KEY_ENV, DEPLOYMENT_KEY)
    engine = TestbedServer(build_config("fixed", {})).start()
    schedule: dict[str, Any] = dict.fromkeys(daemon_jobs(REGISTRY), "off")
    daemon = make_daemon(engine.url, tmp_path, schedule={**schedule, "response-cache": PERIOD, "preflight": "1h"},
                         incident_hold="1s", resolved_notice="1h")
    key: Key = ("foreign_content", "", "tenant-a")
    found_at = time.time() - 5
    seen = finding(kind=FindingKind.FOREIGN_CONTENT, victim_tenant=None, observer_tenant="tenant-a",
                   severity=Severity.WARNING, target="testbed", check="response-cache", found_at=found_at,
                   context=ProbeContext(prompt_tokens=72, boundary="response-cache", status=200), evidence=())
    ledger = open_ledger(str(tmp_path / "l.sqlite"))
    ledger.add_findings([seen])
    ledger.record_checks(RunChecks("testbed", "response-cache", found_at - 1, [Sighting.of(seen)]), found_at)

    async def body(client: httpx.AsyncClient) -> None:
        def closed() -> bool:
            runs = sample(daemon, "leakprobe_job_runs_total", job="response-cache")
            assert runs <= 3, f"{runs:g} clean response-cache runs left it {alerts(daemon, {key})}"
            return closings(daemon, {key}) != {}

        await until(daemon, closed, "the response-cache job's clean re-check")
        assert [how for how, _, _ in closings(daemon, {key}).values()] == ["rechecked"]

    try:
        scenario(daemon, body)
    finally:
        engine.stop()


def closes_by(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, bug: EngineBug,
              jobs: list[str]) -> set[tuple[Key, str, str]]:
    """The daemon running `jobs` against the engine with `bug` opens incidents that `name`'s runs found; the engine
    fixed, they close by clean re-checks, once.  Returns the (incident, job, boundary) rows that found them."""
    monkeypatch.setenv(KEY_ENV, DEPLOYMENT_KEY)
    settings = {**bug_engine(bug), **ENGINE.get(name, {})}
    engine = TestbedServer(build_config("fixed", {**settings, "faults": bug.faults})).start()
    port = engine.port
    rows: set[tuple[Key, str, str]] = set()
    schedule: dict[str, Any] = {job: PERIOD if job in jobs else "off" for job in daemon_jobs(REGISTRY)}
    daemon = make_daemon(engine.url, tmp_path, target=bug.audit, sections=SECTIONS,
                         schedule={**schedule, "preflight": "1h"}, incident_hold="1s", resolved_notice="1h")

    async def body(client: httpx.AsyncClient) -> None:
        nonlocal engine
        def opened() -> bool:
            ran = sample(daemon, "leakprobe_job_runs_total", job=name)
            found = any(labels["job"] == name for labels, _ in series(daemon, FOUND))
            assert found or ran <= RUNS_TO_FIND, f"{ran:g} {name} runs found nothing of {bug.public}"
            return found and sample(daemon, "leakprobe_last_run_timestamp_seconds", job=name) > 0

        await until(daemon, opened, f"a run of the {name} job to end with an incident open on {bug.public}")
        found = {key_of(labels) for labels, value in series(daemon, "leakprobe_incident_alerting") if value == 1}
        engine.stop()
        engine = TestbedServer(build_config("fixed", settings), port=port).start()  # the same address, fixed
        tracked = [Runs(daemon, job) for job in jobs]

        def closed() -> bool:
            for job in tracked:
                job.poll()
            if all(value != 1 for value in alerts(daemon, found).values()):
                return True
            assert not all(job.late for job in tracked), (
                f"still open after {[(job.job, job.began) for job in tracked]} runs at the fix: {alerts(daemon, found)}"
                f"; found: {series(daemon, FOUND)}; clean: {series(daemon, CLEAN)}")
            return False

        await until(daemon, closed, f"the {name} job's clean re-checks to close {sorted(found)}")
        rows.update((key_of(labels), labels["job"], labels["boundary"]) for labels, _ in series(daemon, FOUND)
                    if key_of(labels) in found)
        assert any(job == name for _, job, _ in rows), rows
        assert rows <= {(key_of(labels), labels["job"], labels["boundary"]) for labels, _ in series(daemon, CLEAN)}
        closed_at = closings(daemon, found)
        assert {how for how, _, _ in closed_at.values()} == {"rechecked"} and closed_at.keys() == found, closed_at
        # Closed once: later clean runs leave it closed, at the time it closed.
        later = sample(daemon, "leakprobe_job_runs_total", job=name) + 2
        await until(daemon, lambda: sample(daemon, "leakprobe_job_runs_total", job=name) >= later,
                    f"two more {name} runs")
        assert closings(daemon, found) == closed_at
        assert set(alerts(daemon, found).values()) == {2}

    try:
        scenario(daemon, body)
    finally:
        engine.stop()
    return rows
