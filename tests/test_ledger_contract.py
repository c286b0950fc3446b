"""One contract, every backend: the same tests against a SQLite file and a real PostgreSQL server.

Whatever sits above `open_ledger` (minter, runner, daemon, scan) relies on exactly these properties.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from prober.canaries.mint import Minter
from prober.domain.errors import LedgerError
from prober.domain.evidence import Change, EngineCounters, Exchange, Fragment, FragmentKind, SaltAsserted
from prober.domain.incidents import IncidentKey
from prober.domain.types import Canary, CanaryKind, FindingKind, Severity
from prober.ledger import Ledger, is_shared, open_ledger
from prober.ledger.rows import FINDING_COLUMNS, finding_row
from prober.text.shingles import Shingler
from tests.support.ledgers import OpenLedger, finding
from tests.support.postgres import PostgresServer

KEY = b"k" * 32
def test_canaries_round_trip_with_every_field(connect: OpenLedger) -> None:
    a, b = connect(), connect()
    fact = Canary(id="cn_f", tenant="alice", kind=CanaryKind.FACT, text="탁윤슬 씨는 무진리에 삽니다.",
                  probe_id="p1", pack="ko", values=("탁윤슬", "무진리"), created_at=100.0, expires_at=2e9,
                  embedding=np.arange(4, dtype=np.float32).tobytes(), embedding_model="m",
                  aliases=((0, "Tak Yunseul"), (1, "Mujinri")))
    a.add_canaries([fact])
    assert b.get_canary("cn_f") == fact
    assert b.active_canaries() == [fact] and b.active_canaries(created_since=101.0) == []
    with pytest.raises(LedgerError):
        a.add_canaries([fact])  # an id is minted once


def test_findings_and_incidents_merge_across_handles(connect: OpenLedger) -> None:
    a, b = connect(), connect()
    a.add_findings([finding(found_at=10.0)])
    b.add_findings([finding(found_at=5.0, severity=Severity.CRITICAL), finding(found_at=20.0)])
    b.add_findings([finding(victim_tenant=None, kind=FindingKind.FOREIGN_CONTENT, severity=Severity.WARNING)])
    assert a.findings()[0] == finding(found_at=10.0)
    assert len(a.findings()) == 4
    leak, foreign = a.incidents()
    assert leak.key == IncidentKey("sglang", FindingKind.CROSS_TENANT_ECHO, "alice", "bob") and leak.count == 3
    assert leak.severity is Severity.CRITICAL and (leak.first_seen, leak.last_seen) == (5.0, 20.0)
    assert foreign.key.kind is FindingKind.FOREIGN_CONTENT and foreign.key.victim == "" and foreign.count == 1


def test_a_finding_written_before_evidence_was_typed_still_loads(connect: OpenLedger) -> None:
    """A row as leakprobe wrote it when a finding's details were one free-form object (tests/test_evidence.py has
    every shape): read into typed evidence, on each backend."""
    ledger = connect()
    old = {"fragment": "probe_tag", "tag": "GA432EPR", "probe_id": "p1", "exchange": "x1", "salt_asserted": ["alice"],
           "engine_telemetry": {"sglang:num_aborted_requests_total": {"before": 3.0, "after": 4.0, "delta": 1.0}},
           "prompt_tokens": 681_281, "boundary": "pool+1", "status": 200}
    new = finding(evidence=(Fragment(FragmentKind.PROBE_TAG, tag="GA432EPR"), SaltAsserted(("alice",)), Exchange("x1"),
                            EngineCounters({"sglang:num_aborted_requests_total": Change.between(3.0, 4.0)})), check="")
    row = (*finding_row(new, 0.0)[:16], json.dumps(old))
    ledger._execute(f"INSERT INTO findings ({FINDING_COLUMNS}) VALUES ({', '.join('?' * len(row))})", row)
    assert ledger.findings() == [new]


def test_retention_and_purge(connect: OpenLedger) -> None:
    ledger = connect()
    old = Minter(ledger, KEY, retention_days=1).tokens("a", 3)
    new = Minter(ledger, KEY, retention_days=30).tokens("a", 2)
    later = old[0].created_at + 2 * 86400
    assert {c.id for c in ledger.active_canaries(now=later)} == {c.id for c in new}
    assert ledger.purge_expired(now=later) == 3
    assert ledger.get_canary(old[0].id) is None


def test_an_adapters_canary_is_kept_under_one_id_and_its_retention_extended(connect: OpenLedger) -> None:
    a, b = connect(), connect()
    first = Minter(a, KEY, retention_days=1).adapter("alice", "alice-canary")
    again = Minter(b, KEY, retention_days=30).adapter("alice", "alice-canary")
    assert (again.id, again.text) == (first.id, first.text)  # derived from the key: the adapter's weights hold it
    kept = a.get_canary(first.id)
    assert kept is not None and kept.expires_at == again.expires_at and kept.created_at == first.created_at
    Minter(a, KEY, retention_days=1).adapter("alice", "alice-canary")  # a shorter retention never shortens it
    assert [c.id for c in b.active_canaries(now=first.created_at + 2 * 86400)] == [first.id]
    assert Minter(a, KEY).adapter("bob", "alice-canary").id != first.id


def test_prompt_shingles_round_trip_expire_and_hold_no_text(connect: OpenLedger) -> None:
    a, b = connect(), connect()
    shingler = Shingler(KEY)
    prompt = "Quote the document. The farmer carries the wooden gate near the mill, and the baker reads. " * 3
    old = shingler.record(prompt, "alice", "p1", created_at=100.0, expires_at=200.0)
    new = shingler.record(prompt + " The river opens the blue door.", "bob", "p2", created_at=150.0, expires_at=2e9)
    a.add_prompt_shingles([old, new])
    assert b.prompt_shingles(now=120.0) == [old, new]  # as written, in order, from another handle
    assert b.prompt_shingles(now=120.0, created_since=120.0) == [new] and b.prompt_shingles(now=300.0) == [new]
    assert len(old.hashes) % 8 == 0 and b"farmer" not in old.hashes
    b.purge_expired(now=300.0)
    assert a.prompt_shingles(now=0.0) == [new]


def test_token_budget_is_exact_under_concurrent_replicas(connect: OpenLedger) -> None:
    replicas = [connect() for _ in range(4)]
    granted: list[bool] = []
    lock = threading.Lock()

    def spend(ledger: Ledger) -> None:
        for _ in range(25):
            ok = ledger.spend_tokens("sglang", "2026-11-30", 10, 500)
            with lock:
                granted.append(ok)

    threads = [threading.Thread(target=spend, args=(r,)) for r in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert granted.count(True) == 50 and replicas[0].tokens_spent("sglang", "2026-11-30") == 500
    replicas[1].refund_tokens("sglang", "2026-11-30", 30)
    assert replicas[2].tokens_spent("sglang", "2026-11-30") == 470
    assert replicas[3].tokens_spent("sglang", "2026-12-01") == 0


def test_meta_first_writer_wins(connect: OpenLedger) -> None:
    a, b = connect(), connect()
    assert a.set_meta_if_absent("canary_key", "first") == "first"
    assert b.set_meta_if_absent("canary_key", "second") == "first"
    b.set_meta("last_run/x", "1.5")
    assert a.get_meta("last_run/x") == "1.5" and a.get_meta("absent") is None


def test_one_claim_per_slot(connect: OpenLedger) -> None:
    a, b = connect(), connect()
    assert a.claim_slot("slot/t/campaign", at=1000.0, not_since=500.0)
    assert not b.claim_slot("slot/t/campaign", at=1010.0, not_since=510.0)  # the same slot, a moment later
    assert b.claim_slot("slot/t/campaign", at=2000.0, not_since=1500.0)  # the next one


def test_a_job_lock_is_exclusive_and_released(connect: OpenLedger) -> None:
    a, b = connect(), connect()
    held = a.try_lock("sglang/campaign")
    assert held is not None
    assert b.try_lock("sglang/campaign") is None and a.try_lock("sglang/campaign") is None
    other = b.try_lock("sglang/sentinel")
    assert other is not None
    held.release()
    again = b.try_lock("sglang/campaign")
    assert again is not None
    again.release()
    other.release()


def test_a_dead_holder_leaves_nothing_locked(ledger_url: str, connect: OpenLedger) -> None:
    script = ("import os, sys\nfrom prober.ledger import open_ledger\n"
              f"held = open_ledger({ledger_url!r}).try_lock('t/campaign')\n"
              "print(held is not None, flush=True)\nsys.stdin.readline()\n")
    holder = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
    ledger = connect()
    assert ledger.try_lock("t/campaign") is None
    holder.send_signal(signal.SIGKILL)
    holder.communicate()
    for _ in range(50):  # the server notices the dropped connection at once; allow it a moment
        lock = ledger.try_lock("t/campaign")
        if lock is not None:
            lock.release()
            break
        threading.Event().wait(0.1)
    else:
        pytest.fail("the lock of a killed replica was never released")


def test_descriptions_never_show_a_password(ledger_url: str, connect: OpenLedger) -> None:
    ledger = connect()
    assert is_shared(ledger_url) is ledger_url.startswith("postgresql://")
    if is_shared(ledger_url):
        password = ledger_url.split(":")[2].split("@")[0]
        assert password not in ledger.description and "***" in ledger.description


def test_postgres_password_from_a_file(postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    url = postgres.create_database()
    user_part, host_part = url.removeprefix("postgresql://").split("@")
    user, password = user_part.split(":")
    secret = tmp_path / "ledger-password"
    secret.write_text(password + "\n")
    monkeypatch.setenv("LEAKPROBE_LEDGER_PASSWORD_FILE", str(secret))
    ledger = open_ledger(f"postgresql://{user}@{host_part}")
    ledger.set_meta("k", "v")
    assert ledger.get_meta("k") == "v" and password not in ledger.description
    ledger.close()
    secret.write_text("wrong\n")
    with pytest.raises(LedgerError, match="password authentication failed") as failure:
        open_ledger(f"postgresql://{user}@{host_part}")
    assert password not in str(failure.value)


def test_a_postgres_ledger_of_the_previous_schema_is_upgraded_in_place(postgres: PostgresServer) -> None:
    """A PostgreSQL ledger records its version POSTGRES_OFFSET below the shared migrations it holds: one at the
    previous version (3, migrations 1 to 5) gets migration 6 and keeps its rows."""
    import psycopg

    from prober.ledger.postgres import SCHEMA_VERSION
    from prober.ledger.schema import POSTGRES_OFFSET, migrations

    url = postgres.create_database()
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute("CREATE SCHEMA leakprobe")
        conn.execute("SET LOCAL search_path TO leakprobe")
        for migration in migrations("postgres")[:5]:
            for statement in migration:
                conn.execute(statement)
        conn.execute("INSERT INTO meta VALUES ('schema_version', '3')")
        conn.execute("INSERT INTO token_spend VALUES ('t', '2026-12-04', 7)")
    ledger = open_ledger(url)
    try:
        assert ledger.tokens_spent("t", "2026-12-04") == 7
    finally:
        ledger.close()
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT value FROM leakprobe.meta WHERE key = 'schema_version'").fetchone() == (
            str(SCHEMA_VERSION),)
        assert conn.execute("SELECT 1 FROM pg_indexes WHERE indexname = 'canaries_by_creation'").fetchone()
    assert len(migrations("postgres")) == SCHEMA_VERSION + POSTGRES_OFFSET


def test_postgres_schema_is_versioned_and_a_newer_one_refused(postgres: PostgresServer) -> None:
    url = postgres.create_database()
    open_ledger(url).close()
    open_ledger(url).close()  # a second start migrates nothing
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE leakprobe.meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(LedgerError, match="newer than this leakprobe"):
        open_ledger(url)
