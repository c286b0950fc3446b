"""Every command that records takes the ledger as a path or a URL, the same way: each one run as a process
against a real PostgreSQL by URL, and what it wrote read back by this (another) process; a URL never turns
into a local file (whose path would hold the password)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from prober.domain.types import CanaryKind, FindingKind
from prober.ledger import open_ledger
from tests.support.cli import run
from tests.support.daemonproc import DaemonProcess, daemon_config
from tests.support.keys import TENANT_ARGS
from tests.support.postgres import PostgresServer
from tests.support.testbed import SMALL, StartTestbed


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Commands run in an empty folder, so a URL taken for a file name would show up in it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def nothing_local(folder: Path, password: str) -> None:
    written = [p for p in folder.rglob("*") if "postgres" in p.name or password in str(p)]
    assert not written, f"a ledger URL became local files: {written}"


def password_of(url: str) -> str:
    return url.split("://", 1)[1].split("@", 1)[0].partition(":")[2]


def test_canaries_mint_and_scan_by_url(postgres: PostgresServer, in_tmp: Path) -> None:
    url = postgres.create_database()
    minted = run("canaries", "mint", "--ledger", url, "--tenant", "tenant-a", "--count", "2", "--format", "json")
    assert minted.returncode == 0, minted.stderr
    rows = json.loads(minted.stdout)
    store = open_ledger(url)
    assert {c.id for c in store.active_canaries()} == {r["id"] for r in rows}
    store.close()
    answers = in_tmp / "answers.jsonl"
    answers.write_text(json.dumps({"id": "log-7", "tenant": "tenant-b", "text": f"see {rows[0]['text']}"}) + "\n")
    scanned = run("scan", str(answers), "--ledger", url, "--format", "json", "--no-semantic")
    assert scanned.returncode == 1, scanned.stderr
    store = open_ledger(url)
    [finding] = [f for f in store.findings() if f.record_id == "log-7"]
    assert (finding.kind, finding.victim_tenant, finding.canary_id) == (FindingKind.CROSS_TENANT_ECHO, "tenant-a",
                                                                        rows[0]["id"])
    store.close()
    nothing_local(in_tmp, password_of(url))


def test_audit_by_url(testbed: StartTestbed, postgres: PostgresServer, in_tmp: Path) -> None:
    server = testbed("incident", **SMALL)
    url = postgres.create_database()
    audit = run("audit", "--target", server.url + "/v1", *TENANT_ARGS, "--ledger", url, "--no-semantic",
                "-f", "json")
    assert audit.returncode == 1, audit.stderr[-2000:]
    reported = json.loads(audit.stdout)["findings"]
    store = open_ledger(url)
    assert len(store.findings()) == len(reported) and any(c.kind is CanaryKind.TOKEN for c in store.active_canaries())
    assert {i.key.kind for i in store.incidents()} >= {FindingKind.CROSS_TENANT_ECHO}
    store.close()
    nothing_local(in_tmp, password_of(url))


def test_daemon_ledger_flag_by_url(testbed: StartTestbed, postgres: PostgresServer, in_tmp: Path) -> None:
    server = testbed("incident", **SMALL)
    url = postgres.create_database()
    login, _, rest = url.removeprefix("postgresql://").partition("@")
    config = daemon_config(server.url, in_tmp / "ignored.sqlite")  # the flag wins over the file
    daemon = DaemonProcess(config, in_tmp, env={"PGPASSWORD": password_of(url)})
    daemon.args = ["--ledger", f"postgresql://{login.partition(':')[0]}@{rest}"]
    with daemon:
        daemon.wait_for(lambda: daemon.sample("leakprobe_findings_total", kind="cross_tenant_echo") > 0, 60,
                        "a cross-tenant echo")
        assert daemon.stop() == 0
    store = open_ledger(url)
    assert any(f.kind is FindingKind.CROSS_TENANT_ECHO for f in store.findings())
    store.close()
    assert not (in_tmp / "ignored.sqlite").exists()
    nothing_local(in_tmp, password_of(url))


def test_a_sqlite_url_is_the_absolute_file_and_unknown_schemes_are_refused(in_tmp: Path) -> None:
    target = in_tmp / "deep" / "l.sqlite"
    minted = run("canaries", "mint", "--ledger", f"sqlite://{target}", "--tenant", "tenant-a")
    assert minted.returncode == 0, minted.stderr
    assert target.is_file() and not (in_tmp / "sqlite:").exists()
    for wrong in ("mysql://u:secret-pw@h/db", "postgresql:/h/db"):
        refused = run("canaries", "mint", "--ledger", wrong, "--tenant", "tenant-a", env=dict(os.environ))
        assert refused.returncode == 2 and "unsupported" in refused.stderr and "secret-pw" not in refused.stderr
    assert sorted(p.name for p in in_tmp.iterdir()) == ["deep"]
