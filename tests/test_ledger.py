"""The SQLite ledger's own properties: durable, WAL, refuses what is not its own (the contract every backend
shares is in test_ledger_contract.py)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from prober.domain.errors import LedgerError
from prober.ledger import open_ledger
from prober.ledger.sqlite import SCHEMA_VERSION

KEY = b"k" * 32


def test_minted_canaries_survive_a_killed_process(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    script = (
        "import os, sys\n"
        "from prober.canaries.mint import Minter\n"
        "from prober.ledger import open_ledger\n"
        f"m = Minter(open_ledger({str(path)!r}), b'k' * 32)\n"
        "ids = [c.id for c in m.tokens('tenant-a', 50)]\n"
        "print(','.join(ids), flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == -9
    printed = set(out.stdout.strip().split(","))
    stored = {c.id for c in open_ledger(path).active_canaries()}
    assert printed and printed <= stored


def test_corrupt_foreign_and_newer_files_are_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(LedgerError, match="not a usable leakprobe ledger"):
        open_ledger(garbage)

    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE customers (name TEXT)")
    with pytest.raises(LedgerError, match="belongs to another program"):
        open_ledger(foreign)

    newer = tmp_path / "newer.sqlite"
    open_ledger(newer).close()
    with sqlite3.connect(newer) as db:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(LedgerError, match="newer than this leakprobe"):
        open_ledger(newer)
    with pytest.raises(LedgerError, match=r"postgresql://127.0.0.1:1/leakprobe: .*refused"):
        open_ledger("postgresql://127.0.0.1:1/leakprobe")  # nothing listens there


def test_ledger_is_wal_and_versioned(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    open_ledger(path).close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_key_is_created_once_and_env_key_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prober.canaries.keys import KEY_ENV, resolve_key
    from prober.domain.errors import CanaryKeyError

    monkeypatch.delenv(KEY_ENV, raising=False)
    ledger = open_ledger(tmp_path / "l.sqlite")
    first = resolve_key(ledger)
    assert resolve_key(open_ledger(tmp_path / "l.sqlite")) == first
    monkeypatch.setenv(KEY_ENV, "a shared deployment secret")
    assert resolve_key(ledger) != first and resolve_key(None) == resolve_key(ledger)
    monkeypatch.setenv(KEY_ENV, "short")
    with pytest.raises(CanaryKeyError):
        resolve_key(ledger)
