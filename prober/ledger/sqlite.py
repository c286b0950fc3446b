"""SQLite ledger: WAL journal, synchronous=FULL commits, versioned schema, refuses foreign files.

The file is marked with `PRAGMA application_id` so that leakprobe never silently adopts a database that
some other program wrote.  The mark is read through a read-only connection before anything is written, so
a refused file is left byte for byte as it was (no journal mode switched, no -wal or -shm created).
`PRAGMA user_version` holds the schema version; migrations run forward in one transaction.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prober.incidents import Incident, IncidentKey
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
    # 2: incidents (folded from the findings so far) and the daemon's daily token spend
    """
    CREATE TABLE incidents (
        target TEXT NOT NULL,
        kind TEXT NOT NULL,
        victim TEXT NOT NULL,
        observer TEXT NOT NULL,
        severity INTEGER NOT NULL,
        first_seen REAL NOT NULL,
        last_seen REAL NOT NULL,
        count INTEGER NOT NULL,
        PRIMARY KEY (target, kind, victim, observer)
    );
    INSERT INTO incidents
        SELECT target, kind, coalesce(victim_tenant, ''), observer_tenant,
               max(CASE severity WHEN 'critical' THEN 40 WHEN 'high' THEN 30 WHEN 'warning' THEN 20 ELSE 10 END),
               min(created_at), max(created_at), count(*)
        FROM findings GROUP BY target, kind, coalesce(victim_tenant, ''), observer_tenant;
    CREATE TABLE token_spend (
        target TEXT NOT NULL,
        day TEXT NOT NULL,
        tokens INTEGER NOT NULL,
        PRIMARY KEY (target, day)
    )
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)

CANARY_COLUMNS = ("id, tenant, kind, text, probe_id, pack, slots, created_at, expires_at, embedding, "
                  "embedding_model")
FINDING_COLUMNS = ("created_at, target, record_id, kind, detector, severity, score, observer_tenant, victim_tenant, "
                   "canary_id, probe_id, start_offset, end_offset, excerpt, excerpt_sha256, redacted, details")


class SQLiteLedger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.description = str(path)
        self._lock = threading.Lock()
        memory = str(path) == ":memory:"
        try:
            if not memory and path.exists():
                self._check_identity()
            if not memory:
                path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{path}: not a usable leakprobe ledger ({exc})") from None
        except (OSError, ValueError) as exc:
            raise LedgerError(f"{path}: cannot open ledger ({exc})") from None

    # -- schema ---------------------------------------------------------------------------------
    def _check_identity(self) -> None:
        """Read-only: refuse a file another program wrote, or a newer schema, before touching it."""
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        probe = sqlite3.connect(uri, uri=True)
        try:
            app_id = probe.execute("PRAGMA application_id").fetchone()[0]
            version = probe.execute("PRAGMA user_version").fetchone()[0]
            tables = probe.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        finally:
            probe.close()
        if app_id != APPLICATION_ID and (app_id != 0 or tables):
            raise LedgerError(f"{self.path}: this SQLite file belongs to another program "
                              f"(application_id {app_id:#x}); refusing to use it as a ledger")
        if version > SCHEMA_VERSION:
            raise LedgerError(f"{self.path}: ledger schema {version} is newer than this leakprobe "
                              f"understands ({SCHEMA_VERSION}); upgrade leakprobe")

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        with self._transaction():
            for script in MIGRATIONS[version:]:
                for statement in filter(str.strip, script.split(";")):
                    self._db.execute(statement)
            self._db.execute(f"PRAGMA application_id={APPLICATION_ID}")
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT under the ledger's lock; ROLLBACK on error; errors as LedgerError."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise LedgerError(f"{self.description}: {exc}") from None

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            try:
                return self._db.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise LedgerError(f"{self.description}: {exc}") from None

    # -- canaries -------------------------------------------------------------------------------
    def add_canaries(self, canaries: Sequence[Canary]) -> None:
        rows = [(c.id, c.tenant, c.kind.value, c.text, c.probe_id, c.pack, json.dumps(list(c.slots)),
                 c.created_at, c.expires_at, c.embedding, c.embedding_model) for c in canaries]
        with self._transaction() as db:
            db.executemany(f"INSERT INTO canaries ({CANARY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)

    def active_canaries(self, now: float | None = None, created_since: float | None = None) -> list[Canary]:
        now = time.time() if now is None else now
        rows = self._read(f"SELECT {CANARY_COLUMNS} FROM canaries WHERE expires_at >= ? AND created_at >= ? "
                          "ORDER BY created_at, id", (now, created_since or 0.0))
        return [canary_of(row) for row in rows]

    def get_canary(self, canary_id: str) -> Canary | None:
        rows = self._read(f"SELECT {CANARY_COLUMNS} FROM canaries WHERE id = ?", (canary_id,))
        return canary_of(rows[0]) if rows else None

    def purge_expired(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        with self._transaction() as db:
            return db.execute("DELETE FROM canaries WHERE expires_at < ?", (now,)).rowcount

    # -- findings and incidents -----------------------------------------------------------------
    def add_findings(self, findings: Sequence[Finding]) -> None:
        now = time.time()
        with self._transaction() as db:
            db.executemany(f"INSERT INTO findings ({FINDING_COLUMNS}) VALUES "
                           "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           [finding_row(f, now) for f in findings])
            db.executemany(
                "INSERT INTO incidents (target, kind, victim, observer, severity, first_seen, last_seen, count) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT (target, kind, victim, observer) DO UPDATE SET "
                "severity = max(severity, excluded.severity), first_seen = min(first_seen, excluded.first_seen), "
                "last_seen = max(last_seen, excluded.last_seen), count = count + 1",
                [incident_row(f, now) for f in findings])

    def findings(self) -> list[Finding]:
        return [finding_of(row) for row in self._read(f"SELECT {FINDING_COLUMNS} FROM findings ORDER BY id")]

    def incidents(self) -> list[Incident]:
        rows = self._read("SELECT target, kind, victim, observer, severity, first_seen, last_seen, count "
                          "FROM incidents ORDER BY severity DESC, first_seen")
        return [incident_of(row) for row in rows]

    # -- token spend ----------------------------------------------------------------------------
    def spend_tokens(self, target: str, day: str, tokens: int, limit: int) -> bool:
        with self._transaction() as db:
            row = db.execute("SELECT tokens FROM token_spend WHERE target = ? AND day = ?", (target, day)).fetchone()
            spent = row[0] if row else 0
            if spent + tokens > limit:
                return False
            db.execute("INSERT INTO token_spend (target, day, tokens) VALUES (?, ?, ?) ON CONFLICT (target, day) "
                       "DO UPDATE SET tokens = tokens + excluded.tokens", (target, day, tokens))
            return True

    def refund_tokens(self, target: str, day: str, tokens: int) -> None:
        with self._transaction() as db:
            db.execute("UPDATE token_spend SET tokens = max(0, tokens - ?) WHERE target = ? AND day = ?",
                       (tokens, target, day))

    def tokens_spent(self, target: str, day: str) -> int:
        rows = self._read("SELECT tokens FROM token_spend WHERE target = ? AND day = ?", (target, day))
        return int(rows[0][0]) if rows else 0

    # -- meta -----------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta_if_absent(self, key: str, value: str) -> str:
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", (key, value))
            stored: str = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0]
        return stored

    def set_meta(self, key: str, value: str) -> None:
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def check_writable(self) -> None:
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('last_write_check', ?)", (str(time.time()),))

    def close(self) -> None:
        with self._lock:
            self._db.close()


# -- rows <-> values (shared with the PostgreSQL backend) --------------------------------------
def canary_of(row: Sequence[Any]) -> Canary:
    return Canary(id=row[0], tenant=row[1], kind=CanaryKind(row[2]), text=row[3], probe_id=row[4], pack=row[5],
                  slots=tuple(json.loads(row[6])), created_at=row[7], expires_at=row[8],
                  embedding=bytes(row[9]) if row[9] is not None else None, embedding_model=row[10])


def finding_row(f: Finding, now: float) -> tuple[Any, ...]:
    return (f.found_at or now, f.target, f.record_id, f.kind.value, f.detector, f.severity.label, f.score,
            f.observer_tenant, f.victim_tenant, f.canary_id, f.probe_id, f.start, f.end, f.excerpt, f.excerpt_sha256,
            int(f.redacted), json.dumps(f.details))


def finding_of(r: Sequence[Any]) -> Finding:
    return Finding(found_at=r[0], target=r[1], record_id=r[2], kind=FindingKind(r[3]), detector=r[4],
                   severity=Severity.parse(r[5]), score=r[6], observer_tenant=r[7], victim_tenant=r[8],
                   canary_id=r[9], probe_id=r[10], start=r[11], end=r[12], excerpt=r[13], excerpt_sha256=r[14],
                   redacted=bool(r[15]), details=json.loads(r[16]))


def incident_row(f: Finding, now: float) -> tuple[Any, ...]:
    key = IncidentKey.of(f)
    at = f.found_at or now
    return (key.target, key.kind.value, key.victim, key.observer, int(f.severity), at, at)


def incident_of(row: Sequence[Any]) -> Incident:
    return Incident(IncidentKey(row[0], FindingKind(row[1]), row[2], row[3]), Severity(row[4]), row[5], row[6], row[7])
