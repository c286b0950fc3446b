"""Incident lifecycle: when an incident closes (a clean re-check of every check that found it, after the hold;
an acknowledgement; the hold alone where no daemon check can re-check it), and the ledger's part of it on
SQLite and a real PostgreSQL — checks, re-checks and acknowledgements shared by every handle, and a ledger
written by the previous schema upgraded in place."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from prober.daemon.evidence import RunEvidence
from prober.domain.incidents import (
    Acknowledgement,
    Closure,
    Incident,
    IncidentKey,
    Observation,
    Recheck,
    RunChecks,
    Sighting,
)
from prober.domain.types import Finding, FindingKind, ProbeContext, Severity
from prober.ledger import open_ledger
from prober.ledger.sqlite import MIGRATIONS
from prober.probing.context import record
from prober.probing.events import CheckDone, FindingRecorded
from prober.probing.exchanges import counterpart
from prober.probing.plan import Exchange, Step
from prober.probing.results import CheckResult, ShapeResult, StepResult
from prober.targets.result import Completion
from tests.support.ledgers import OpenLedger, finding

KEY = IncidentKey("sglang", FindingKind.CROSS_TENANT_ECHO, "alice", "bob")
HOLD = 600.0


def incident(*checks: Recheck, last_seen: float = 1_000.0, ack: Acknowledgement | None = None) -> Incident:
    return Incident(KEY, Severity.CRITICAL, 900.0, last_seen, 3, checks=list(checks), ack=ack)


@pytest.mark.unit
def test_an_incident_stays_open_until_every_check_that_found_it_is_clean() -> None:
    found = Recheck("campaign", "pool+1", last_found=1_000.0, prompt_tokens=4_097)
    also = Recheck("campaign", "pool+page", last_found=990.0)
    assert incident(found, also).resolution(HOLD) is None
    assert incident(found, also).is_open(10**9, HOLD)  # whatever the clock says
    one_clean = incident(found, Recheck("campaign", "pool+page", last_found=990.0, last_clean=5_000.0))
    assert one_clean.resolution(HOLD) is None and [p.boundary for p in one_clean.pending()] == ["pool+1"]
    both = incident(Recheck("campaign", "pool+1", last_found=1_000.0, last_clean=7_000.0),
                    Recheck("campaign", "pool+page", last_found=990.0, last_clean=5_000.0))
    closed = both.resolution(HOLD)
    assert closed is not None and closed.how is Closure.RECHECKED and closed.at == 7_000.0
    assert closed.check is not None and closed.check.boundary == "pool+1"
    assert "clean re-check at boundary pool+1 (campaign job)" in closed.describe()
    assert both.is_open(6_999.0, HOLD) and not both.is_open(7_000.0, HOLD)


@pytest.mark.unit
def test_the_hold_is_a_floor() -> None:
    early = incident(Recheck("sentinel", "sentinel", last_found=1_000.0, last_clean=1_060.0))
    closed = early.resolution(HOLD)
    assert closed is not None and closed.at == 1_000.0 + HOLD
    assert early.is_open(1_500.0, HOLD) and not early.is_open(1_600.0, HOLD)
    assert "when the hold ended" in closed.describe()


@pytest.mark.unit
def test_a_clean_recheck_older_than_the_last_finding_does_not_count() -> None:
    assert incident(Recheck("campaign", "pool+1", last_found=1_000.0, last_clean=1_000.0)).resolution(HOLD) is None


@pytest.mark.unit
def test_an_acknowledgement_closes_it_until_a_newer_finding() -> None:
    ack = Acknowledgement("oncall-ana", 2_000.0, "engine drained, ticket SEC-1")
    acked = incident(Recheck("campaign", "pool+1", last_found=1_000.0), ack=ack)
    closed = acked.resolution(HOLD)
    assert closed is not None and closed.how is Closure.ACKNOWLEDGED and not acked.is_open(2_000.0, HOLD)
    assert closed.describe().startswith("acknowledged by oncall-ana at ") and "SEC-1" not in closed.describe()
    again = incident(Recheck("campaign", "pool+1", last_found=2_500.0), last_seen=2_500.0, ack=ack)
    assert again.resolution(HOLD) is None


@pytest.mark.unit
def test_a_finding_no_daemon_check_made_closes_with_the_hold() -> None:
    uncovered = incident()  # an audit's finding, or one recorded just before a crash
    closed = uncovered.resolution(HOLD)
    assert closed is not None and closed.how is Closure.HELD and closed.at == 1_000.0 + HOLD
    stale_check = incident(Recheck("campaign", "pool+1", last_found=900.0, last_clean=950.0))  # the newest is not its
    held = stale_check.resolution(HOLD)
    assert held is not None and held.how is Closure.HELD


@pytest.mark.unit
def test_the_status_form_says_what_it_waits_for_and_why_it_closed() -> None:
    waiting = incident(Recheck("campaign", "pool+1", last_found=1_000.0, prompt_tokens=4_097)).state_json(HOLD, 2_000.0)
    assert waiting["state"] == "open" and waiting["waiting_for"] == ["boundary pool+1 (campaign job)"]
    assert waiting["closed"] is None
    done = incident(Recheck("campaign", "pool+1", last_found=1_000.0, last_clean=9_000.0)).state_json(HOLD, 9_500.0)
    assert done["state"] == "closed" and done["waiting_for"] == []
    assert isinstance(done["closed"], dict) and done["closed"]["how"] == "rechecked"
    assert incident().to_json() == {k: v for k, v in incident().state_json(HOLD, 2_000.0).items()
                                    if k in ("target", "kind", "victim", "observer", "severity", "first_seen",
                                             "last_seen", "count")}


def checks(started: float, *sightings: Sighting, observed: tuple[Observation, ...] = (),
           job: str = "campaign") -> RunChecks:
    return RunChecks("sglang", job, started, list(sightings), set(observed))


def test_checks_rechecks_and_acks_are_shared_by_every_handle(connect: OpenLedger) -> None:
    a, b = connect(), connect()
    a.add_findings([finding(found_at=1_000.0), finding(found_at=1_010.0, victim_tenant=None,
                                                        kind=FindingKind.BOUNDARY_ACCEPTED)])
    pool = Sighting(KEY, "pool+1", 1_000.0, 4_097)
    accepted = Sighting(IncidentKey("sglang", FindingKind.BOUNDARY_ACCEPTED, "", "bob"), "pool+1", 1_010.0, 4_097)
    a.record_checks(checks(990.0, pool, accepted, observed=(Observation("pool+1", "bob", "alice"),)), 1_020.0)
    (leak,) = [i for i in b.incidents() if i.key == KEY]
    assert leak.checks == [Recheck("campaign", "pool+1", last_found=1_000.0, prompt_tokens=4_097)]  # found in this run
    # A later campaign observes bob at pool+1 in an exchange with carol: alice's leak is not re-checked by it,
    # the incident that names no victim is.
    b.record_checks(checks(2_000.0, observed=(Observation("pool+1", "bob", "carol"),)), 2_050.0)
    by_kind = {i.key.kind: i for i in a.incidents()}
    assert by_kind[FindingKind.CROSS_TENANT_ECHO].checks[0].last_clean is None
    assert by_kind[FindingKind.BOUNDARY_ACCEPTED].checks[0].last_clean == 2_050.0
    # The same job elsewhere, or another boundary, re-checks nothing of it.
    b.record_checks(checks(3_000.0, observed=(Observation("pool+1", "bob", "alice"),), job="sentinel"), 3_010.0)
    b.record_checks(checks(3_000.0, observed=(Observation("pool", "bob", "alice"),)), 3_010.0)
    assert next(i for i in a.incidents() if i.key == KEY).checks[0].last_clean is None
    b.record_checks(checks(4_000.0, observed=(Observation("pool+1", "bob", "alice"),)), 4_100.0)
    (leak,) = [i for i in a.incidents() if i.key == KEY]
    assert leak.checks[0].last_clean == 4_100.0
    resolved = leak.resolution(HOLD)
    assert resolved is not None and resolved.how is Closure.RECHECKED and resolved.at == 4_100.0
    # Found again, later, at a longer prompt: open, and the check remembers the newest prompt length.
    a.add_findings([finding(found_at=5_000.0)])
    a.record_checks(checks(4_900.0, Sighting(KEY, "pool+1", 5_000.0, 4_113)), 5_010.0)
    (leak,) = [i for i in b.incidents() if i.key == KEY]
    assert leak.resolution(HOLD) is None and leak.checks[0].prompt_tokens == 4_113
    assert a.acknowledge(KEY, Acknowledgement("ana", 6_000.0, "drained"))
    assert b.acknowledge(KEY, Acknowledgement("ben", 6_100.0))
    assert next(i for i in a.incidents() if i.key == KEY).ack == Acknowledgement("ben", 6_100.0)
    assert not a.acknowledge(IncidentKey("sglang", FindingKind.CROSS_TENANT_ECHO, "x", "y"),
                             Acknowledgement("ana", 1.0))


def test_the_first_clean_recheck_closes_it_and_later_ones_leave_the_closing_time(connect: OpenLedger) -> None:
    """A clean re-check every few minutes must not move the closing time (and so restart the resolved notice): the
    alert says "resolved" once."""
    ledger = connect()
    ledger.add_findings([finding(found_at=1_000.0)])
    ledger.record_checks(checks(990.0, Sighting(KEY, "pool+1", 1_000.0, 4_097)), 1_010.0)
    for started in (2_000.0, 3_000.0, 4_000.0):
        ledger.record_checks(checks(started, observed=(Observation("pool+1", "bob", "alice"),)), started + 10)
    (leak,) = [i for i in ledger.incidents() if i.key == KEY]
    resolved = leak.resolution(HOLD)
    assert leak.checks[0].last_clean == 2_010.0
    assert resolved is not None and resolved.at == 2_010.0


def test_a_blind_recheck_clears_what_the_envelope_shows_not_what_content_shows(connect: OpenLedger) -> None:
    """A run whose answers never carried their own canary could not have seen the leak again: it re-checks the
    boundary's envelope findings (a refusal now), not the echo."""
    ledger = connect()
    accepted = IncidentKey("sglang", FindingKind.BOUNDARY_ACCEPTED, "", "bob")
    ledger.add_findings([finding(found_at=1_000.0), finding(found_at=1_000.0, victim_tenant=None,
                                                            kind=FindingKind.BOUNDARY_ACCEPTED)])
    ledger.record_checks(checks(990.0, Sighting(KEY, "pool+1", 1_000.0, 4_097),
                                Sighting(accepted, "pool+1", 1_000.0, 4_097)), 1_010.0)
    ledger.record_checks(checks(2_000.0, observed=(Observation("pool+1", "bob", "alice", sighted=False),)), 2_010.0)
    by_kind = {i.key.kind: i for i in ledger.incidents()}
    assert by_kind[FindingKind.CROSS_TENANT_ECHO].checks[0].last_clean is None
    assert by_kind[FindingKind.BOUNDARY_ACCEPTED].checks[0].last_clean == 2_010.0


def test_a_recheck_without_the_engines_counters_leaves_a_counted_failure_open(connect: OpenLedger) -> None:
    """An abort the engine counted while it answered 200 shows only in its counters: a run that could not read them
    (the engine's /metrics gone, every window set aside) re-checks what the answers show, not that."""
    ledger = connect()
    counted = IncidentKey("sglang", FindingKind.COUNTED_FAILURE, "", "bob")
    ledger.add_findings([finding(found_at=1_000.0, victim_tenant=None, kind=FindingKind.COUNTED_FAILURE),
                         finding(found_at=1_000.0, victim_tenant=None, kind=FindingKind.BOUNDARY_ACCEPTED)])
    ledger.record_checks(checks(990.0, Sighting(counted, "pool+1", 1_000.0, 4_097),
                                Sighting(IncidentKey("sglang", FindingKind.BOUNDARY_ACCEPTED, "", "bob"), "pool+1",
                                         1_000.0, 4_097)), 1_010.0)
    ledger.record_checks(checks(2_000.0, observed=(Observation("pool+1", "bob", "alice"),)), 2_010.0)
    by_kind = {i.key.kind: i for i in ledger.incidents()}
    assert by_kind[FindingKind.BOUNDARY_ACCEPTED].checks[0].last_clean == 2_010.0
    assert by_kind[FindingKind.COUNTED_FAILURE].checks[0].last_clean is None
    ledger.record_checks(checks(3_000.0, observed=(Observation("pool+1", "bob", "alice", counted=True),)), 3_010.0)
    assert {i.key.kind: i for i in ledger.incidents()}[FindingKind.COUNTED_FAILURE].checks[0].last_clean == 3_010.0


def _step(step: Step, own: int = 0, found: tuple[Finding, ...] = (), served: bool = True) -> StepResult:
    answer = Completion(200, "an answer") if served else Completion(None, "", error=None)
    return StepResult(step=step, exchange=step.id.split("-")[0], target="sglang", sent_tokens=64, counted=True,
                      answer=answer, canary_ids=[], findings=list(found), own_echoes=own)


def _evidence(job: str, tenants: tuple[str, ...] = ("alice", "bob")) -> tuple[RunEvidence, list[RunChecks]]:
    written: list[RunChecks] = []

    async def write(checks: RunChecks) -> None:
        written.append(checks)

    return RunEvidence("sglang", job, 100.0, tenants, write), written


@pytest.mark.unit
def test_an_answer_that_drew_a_finding_rechecks_only_the_envelope() -> None:
    """An engine that still serves a prompt above its pool answers from whatever its stale pages hold (another
    job's prompt, under load): that answer lacking the victim's canary is luck, not a fix, so the pair there
    re-checks only what the envelope shows, while the run's sound answers elsewhere (an info finding is no fault)
    still re-check content; the engine's counters read around an exchange re-check what only they show."""
    def exchange(name: str, boundary: str) -> Exchange:
        def step(role: str, tenant: str) -> Step:
            return Step(id=f"{name}-{role}", role=role, tenant=tenant, length=64, stream=False,  # type: ignore[arg-type]
                        expect_served=boundary == "pool", boundary=boundary)
        return Exchange(id=name, victim="alice", observer="bob", prime=step("prime", "alice"),
                        probe=step("probe", "bob"))

    fits, above = exchange("x001", "pool"), exchange("x002", "pool+1")
    evidence, written = _evidence("campaign")
    result = CheckResult(check="campaign")
    note = finding(kind=FindingKind.ODD_FINISH_REASON, severity=Severity.INFO, victim_tenant=None)
    accepted = finding(kind=FindingKind.BOUNDARY_ACCEPTED, victim_tenant=None)

    async def run() -> None:  # findings are written as they are told: on the run's loop
        for ex, step, judged, read in ((fits, fits.prime, _step(fits.prime), True),
                                       (fits, fits.probe, _step(fits.probe, own=1, found=(note,)), True),
                                       (above, above.prime, _step(above.prime), False),
                                       (above, above.probe, _step(above.probe, found=(accepted,)), False)):
            record(judged, result, evidence, others=counterpart(ex, step), counted=read)
        evidence(CheckDone("sglang", result))
        await evidence.finish()

    asyncio.run(run())
    assert [run.job for run in written] == ["campaign", "campaign"]  # the finding's check, then the re-checks
    assert written[-1].observations == {
        Observation("pool", "bob", "alice", counted=True), Observation("pool", "alice", "bob", counted=True),
        Observation("pool+1", "alice", "bob"), Observation("pool+1", "bob", "alice", sighted=False)}


@pytest.mark.unit
def test_every_check_reports_its_own_observations_and_sight() -> None:
    """A check without exchanges (request IDs, idle slots, a burst) scans each answer for every tenant's canaries: a
    clean one re-checks each pair its tenant is the observer of, itself included (two requests of one tenant), at
    that check's boundary.  A check without sight re-checks only what the envelope shows; a request that was not
    observed re-checks nothing; the probe-shape controls a check ran first are the `shapes` check's."""
    def step(tenant: str, boundary: str, role: str = "probe") -> Step:
        return Step(id=f"{tenant}-{boundary}", role=role, tenant=tenant, length=64, stream=False,  # type: ignore[arg-type]
                    expect_served=True, boundary=boundary)

    evidence, written = _evidence("request-ids", ("alice", "bob", "carol"))
    shapes, ids = ShapeResult(check="shapes"), CheckResult(check="request-ids")

    async def run() -> None:
        record(_step(step("alice", "shape:chat", "control"), own=1), shapes, evidence)
        evidence(FindingRecorded(finding(check="shapes", context=ProbeContext(boundary="shape:chat"))))
        evidence(CheckDone("sglang", shapes))  # no choice recorded: blind
        record(_step(step("bob", "request-id")), ids, evidence)
        record(_step(step("carol", "request-id"), served=False), ids, evidence)
        evidence(CheckDone("sglang", ids))
        await evidence.finish()

    asyncio.run(run())
    by_job = {run.job: run for run in written if run.observations}
    assert [run.job for run in written if run.sightings] == ["shapes"]
    assert by_job["shapes"].observations == {Observation("shape:chat", "alice", other, sighted=False)
                                             for other in ("alice", "bob", "carol")}
    assert by_job["request-ids"].observations == {Observation("request-id", "bob", other, sighted=False)
                                                  for other in ("alice", "bob", "carol")}


def test_a_ledger_of_the_previous_schema_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    for migration in MIGRATIONS[:3]:
        db.executescript(";".join(migration))
    db.execute("INSERT INTO incidents VALUES ('sglang', 'cross_tenant_echo', 'alice', 'bob', 40, 1.0, 2.0, 5)")
    db.execute("PRAGMA application_id=0x4C50524B")
    db.execute("PRAGMA user_version=3")
    db.commit()
    db.close()
    ledger = open_ledger(path)
    try:
        (old,) = ledger.incidents()
        assert old.count == 5 and old.checks == [] and old.ack is None
        held = old.resolution(HOLD)  # recorded before re-checks existed: it closes by the hold, as it did
        assert held is not None and held.how is Closure.HELD and held.at == 2.0 + HOLD
        assert ledger.acknowledge(old.key, Acknowledgement("ana", 3.0))
    finally:
        ledger.close()


def test_checks_the_campaign_used_to_run_wait_for_the_jobs_that_run_them_now(tmp_path: Path) -> None:
    """Schema 8: an open incident found at the prefix cache or a repeat under the campaign job waits for the
    `prefix-cache` job's clean re-check (the campaign no longer sends those); the campaign's own boundaries stay."""
    path = tmp_path / "v7.sqlite"
    db = sqlite3.connect(path)
    for migration in MIGRATIONS[:7]:
        db.executescript(";".join(migration))
    db.execute("INSERT INTO incidents VALUES ('vllm', 'cross_tenant_echo', 'alice', 'bob', 40, 1.0, 2.0, 3)")
    for boundary in ("prefix-cache", "repeat", "pool+1"):
        db.execute("INSERT INTO incident_checks VALUES ('vllm', 'cross_tenant_echo', 'alice', 'bob', 'campaign', ?, "
                   "40, 2.0, NULL)", (boundary,))
    db.execute("PRAGMA application_id=0x4C50524B")
    db.execute("PRAGMA user_version=7")
    db.commit()
    db.close()
    ledger = open_ledger(path)
    try:
        (incident,) = ledger.incidents()
        assert sorted((c.job, c.boundary) for c in incident.checks) == [
            ("campaign", "pool+1"), ("prefix-cache", "prefix-cache"), ("prefix-cache", "repeat")]
    finally:
        ledger.close()
