"""SQLite ledger: WAL journal, synchronous=FULL commits, versioned schema, refuses foreign files.

The file is marked with `PRAGMA application_id` so that leakprobe never silently adopts a database
that some other program wrote; `PRAGMA user_version` holds the schema version and migrations run
forward in one transaction.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prober.ledger.base import LedgerError
from prober.types import Canary, CanaryKind, Finding, FindingKind, Severity

APPLICATION_ID = 0x4C50524B  # "LPRK"

MIGRATIONS: list[str] = [
    # 1: canaries, findings, meta
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE canaries (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('token', 'fact')),
        text TEXT NOT NULL,
        probe_id TEXT NOT NULL DEFAULT '',
        pack TEXT NOT NULL DEFAULT '',
        slots TEXT NOT NULL DEFAULT '[]',
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        embedding BLOB,
        embedding_model TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX canaries_by_expiry ON canaries (expires_at);
    CREATE TABLE findings (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        created_at REAL NOT NULL,
        target TEXT NOT NULL DEFAULT '',
        record_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        detector TEXT NOT NULL,
        severity TEXT NOT NULL,
        score REAL NOT NULL,
        observer_tenant TEXT NOT NULL,
        victim_tenant TEXT,
        canary_id TEXT,
        probe_id TEXT,
        start_offset INTEGER NOT NULL,
        end_offset INTEGER NOT NULL,
        excerpt TEXT NOT NULL,
        excerpt_sha256 TEXT NOT NULL,
        redacted INTEGER NOT NULL,
        details TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX findings_by_canary ON findings (canary_id);
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)

_CANARY_COLUMNS = ("id, tenant, kind, text, probe_id, pack, slots, created_at, expires_at, embedding, "
                   "embedding_model")


class SQLiteLedger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{path}: not a usable leakprobe ledger ({exc})") from None
        except OSError as exc:
            raise LedgerError(f"{path}: cannot open ledger ({exc})") from None

    # -- schema ---------------------------------------------------------------------------------
    def _migrate(self) -> None:
        app_id = self._db.execute("PRAGMA application_id").fetchone()[0]
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        tables = self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if app_id != APPLICATION_ID and (app_id != 0 or tables):
            raise LedgerError(f"{self.path}: this SQLite file belongs to another program "
                              f"(application_id {app_id:#x}); refusing to use it as a ledger")
        if version > SCHEMA_VERSION:
            raise LedgerError(f"{self.path}: ledger schema {version} is newer than this leakprobe "
                              f"understands ({SCHEMA_VERSION}); upgrade leakprobe")
        if version == SCHEMA_VERSION:
            return
        with self._transaction():
            for script in MIGRATIONS[version:]:
                for statement in filter(str.strip, script.split(";")):
                    self._db.execute(statement)
            self._db.execute(f"PRAGMA application_id={APPLICATION_ID}")
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db, self._lock)

    # -- canaries -------------------------------------------------------------------------------
    def add_canaries(self, canaries: Sequence[Canary]) -> None:
        rows = [(c.id, c.tenant, c.kind.value, c.text, c.probe_id, c.pack, json.dumps(list(c.slots)),
                 c.created_at, c.expires_at, c.embedding, c.embedding_model) for c in canaries]
        with self._transaction():
            self._db.executemany(f"INSERT INTO canaries ({_CANARY_COLUMNS}) VALUES "
                                 "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)

    def active_canaries(self, now: float | None = None) -> list[Canary]:
        now = time.time() if now is None else now
        with self._lock:
            rows = self._db.execute(f"SELECT {_CANARY_COLUMNS} FROM canaries WHERE expires_at >= ? "
                                    "ORDER BY created_at, id", (now,)).fetchall()
        return [_canary(row) for row in rows]

    def get_canary(self, canary_id: str) -> Canary | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_CANARY_COLUMNS} FROM canaries WHERE id = ?",
                                   (canary_id,)).fetchone()
        return _canary(row) if row else None

    def purge_expired(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        with self._transaction():
            return self._db.execute("DELETE FROM canaries WHERE expires_at < ?", (now,)).rowcount

    # -- findings -------------------------------------------------------------------------------
    def add_findings(self, findings: Sequence[Finding], target: str = "") -> None:
        now = time.time()
        rows = [(now, target, f.record_id, f.kind.value, f.detector, f.severity.label, f.score,
                 f.observer_tenant, f.victim_tenant, f.canary_id, f.probe_id, f.start, f.end, f.excerpt,
                 f.excerpt_sha256, int(f.redacted), json.dumps(f.details)) for f in findings]
        with self._transaction():
            self._db.executemany(
                "INSERT INTO findings (created_at, target, record_id, kind, detector, severity, score, "
                "observer_tenant, victim_tenant, canary_id, probe_id, start_offset, end_offset, excerpt, "
                "excerpt_sha256, redacted, details) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def findings(self) -> list[Finding]:
        with self._lock:
            rows = self._db.execute(
                "SELECT record_id, kind, detector, severity, score, observer_tenant, victim_tenant, "
                "canary_id, probe_id, start_offset, end_offset, excerpt, excerpt_sha256, redacted, details "
                "FROM findings ORDER BY id").fetchall()
        return [Finding(record_id=r[0], kind=FindingKind(r[1]), detector=r[2], severity=Severity.parse(r[3]),
                        score=r[4], observer_tenant=r[5], victim_tenant=r[6], canary_id=r[7], probe_id=r[8],
                        start=r[9], end=r[10], excerpt=r[11], excerpt_sha256=r[12], redacted=bool(r[13]),
                        details=json.loads(r[14])) for r in rows]

    # -- meta -----------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta_if_absent(self, key: str, value: str) -> str:
        with self._transaction():
            self._db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", (key, value))
            stored: str = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0]
        return stored

    def close(self) -> None:
        with self._lock:
            self._db.close()


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT under the ledger's lock; ROLLBACK on error."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock) -> None:
        self.db, self.lock = db, lock

    def __enter__(self) -> None:
        self.lock.acquire()
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self.lock.release()
            raise

    def __exit__(self, exc_type: object, *_: object) -> None:
        try:
            self.db.execute("ROLLBACK" if exc_type else "COMMIT")
        finally:
            self.lock.release()


def _canary(row: tuple[Any, ...]) -> Canary:
    return Canary(id=row[0], tenant=row[1], kind=CanaryKind(row[2]), text=row[3], probe_id=row[4], pack=row[5],
                  slots=tuple(json.loads(row[6])), created_at=row[7], expires_at=row[8], embedding=row[9],
                  embedding_model=row[10])


def open_ledger(path: str | Path) -> SQLiteLedger:
    """Open (creating if absent) the ledger at path; a `postgresql://` URL is reserved for later."""
    text = str(path)
    if text.startswith(("postgres://", "postgresql://")):
        raise LedgerError("the PostgreSQL ledger backend is not available in this version; use a file path")
    return SQLiteLedger(Path(text))
