"""PostgreSQL ledger, for several replicas sharing one record of canaries, findings, incidents and spend.

Everything lives in the `leakprobe` schema of the database, so it can share a database with other
applications.  `leakprobe.meta` holds the schema version; migrations run forward in one transaction under
an advisory lock, so replicas starting together migrate once.  A job lock is a session advisory lock on a
connection of its own: it is released when the job ends, and by the server when a replica dies (at once
when its process dies; within about a minute, by keepalive probes, when its whole host vanishes).

The password comes from the URL, from PGPASSWORD, or from the file LEAKPROBE_LEDGER_PASSWORD_FILE names;
the ledger's description (what messages print) never shows it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from prober.errors import LedgerError
from prober.ledger.base import JobLock
from prober.ledger.credentials import masked, password_from_file
from prober.ledger.sql import SQLLedger, statements

SCHEMA = "leakprobe"
MIGRATIONS: list[str] = [
    # 1: everything the SQLite ledger has at its version 3
    f"""
    CREATE TABLE {SCHEMA}.canaries (
        id TEXT PRIMARY KEY, tenant TEXT NOT NULL, kind TEXT NOT NULL CHECK (kind IN ('token', 'fact')),
        text TEXT NOT NULL, probe_id TEXT NOT NULL DEFAULT '', pack TEXT NOT NULL DEFAULT '',
        slots TEXT NOT NULL DEFAULT '[]', created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL, embedding BYTEA, embedding_model TEXT NOT NULL DEFAULT '',
        aliases TEXT NOT NULL DEFAULT '[]');
    CREATE INDEX canaries_by_expiry ON {SCHEMA}.canaries (expires_at);
    CREATE INDEX canaries_by_creation ON {SCHEMA}.canaries (created_at);
    CREATE TABLE {SCHEMA}.findings (
        id BIGSERIAL PRIMARY KEY, created_at DOUBLE PRECISION NOT NULL, target TEXT NOT NULL DEFAULT '',
        record_id TEXT NOT NULL, kind TEXT NOT NULL, detector TEXT NOT NULL, severity TEXT NOT NULL,
        score DOUBLE PRECISION NOT NULL, observer_tenant TEXT NOT NULL, victim_tenant TEXT, canary_id TEXT,
        probe_id TEXT, start_offset INTEGER NOT NULL, end_offset INTEGER NOT NULL, excerpt TEXT NOT NULL,
        excerpt_sha256 TEXT NOT NULL, redacted INTEGER NOT NULL, details TEXT NOT NULL DEFAULT '{{}}');
    CREATE INDEX findings_by_canary ON {SCHEMA}.findings (canary_id);
    CREATE TABLE {SCHEMA}.incidents (
        target TEXT NOT NULL, kind TEXT NOT NULL, victim TEXT NOT NULL, observer TEXT NOT NULL,
        severity INTEGER NOT NULL, first_seen DOUBLE PRECISION NOT NULL, last_seen DOUBLE PRECISION NOT NULL,
        count BIGINT NOT NULL, PRIMARY KEY (target, kind, victim, observer));
    CREATE TABLE {SCHEMA}.token_spend (
        target TEXT NOT NULL, day TEXT NOT NULL, tokens BIGINT NOT NULL, PRIMARY KEY (target, day))
    """,
    # 2: the SQLite ledger's version 4 (incident probes and acknowledgements)
    f"""
    CREATE TABLE {SCHEMA}.incident_probes (
        target TEXT NOT NULL, kind TEXT NOT NULL, victim TEXT NOT NULL, observer TEXT NOT NULL, job TEXT NOT NULL,
        boundary TEXT NOT NULL, prompt_tokens BIGINT, last_found DOUBLE PRECISION NOT NULL,
        last_clean DOUBLE PRECISION, PRIMARY KEY (target, kind, victim, observer, job, boundary));
    CREATE INDEX incident_probes_by_check ON {SCHEMA}.incident_probes (target, job, boundary, observer);
    CREATE TABLE {SCHEMA}.incident_acks (
        id BIGSERIAL PRIMARY KEY, target TEXT NOT NULL, kind TEXT NOT NULL, victim TEXT NOT NULL,
        observer TEXT NOT NULL, acked_at DOUBLE PRECISION NOT NULL, acked_by TEXT NOT NULL,
        note TEXT NOT NULL DEFAULT '')
    """,
    # 3: the SQLite ledger's version 5 (prompt shingles)
    f"""
    CREATE TABLE {SCHEMA}.prompt_shingles (
        id BIGSERIAL PRIMARY KEY, tenant TEXT NOT NULL, probe_id TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL, hashes BYTEA NOT NULL);
    CREATE INDEX prompt_shingles_by_expiry ON {SCHEMA}.prompt_shingles (expires_at)
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)
MIGRATION_LOCK = 0x4C50524B  # "LPRK"
LOCK_KEEPALIVE = (("tcp_keepalives_idle", 30), ("tcp_keepalives_interval", 10), ("tcp_keepalives_count", 3))


def lock_key(name: str) -> int:
    """A signed 64-bit advisory-lock key for a name."""
    return int.from_bytes(hashlib.sha256(b"leakprobe\x00" + name.encode()).digest()[:8], "big", signed=True)


class PostgresLock(JobLock):
    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection

    def release(self) -> None:
        self.connection.close()  # the session's advisory locks go with it


class PostgresLedger(SQLLedger):
    mark = "%s"
    greatest = "GREATEST"
    least = "LEAST"

    def __init__(self, url: str) -> None:
        self.url = url
        self.description = masked(url)
        try:
            given = psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise LedgerError(f"not a usable PostgreSQL URL: {exc}") from None
        self._kwargs: dict[str, Any] = {"connect_timeout": 10}
        file_password = password_from_file()
        if file_password and "password" not in given:
            self._kwargs["password"] = file_password
        try:
            with psycopg.connect(url, autocommit=True, **self._kwargs) as conn:  # fails fast, with the reason
                self._migrate(conn)
            self._pool = ConnectionPool(url, kwargs={**self._kwargs, "autocommit": True}, min_size=1, max_size=4,
                                        open=False, name="leakprobe-ledger", configure=_use_schema)
            self._pool.open(wait=True, timeout=15)
        except (psycopg.Error, PoolTimeout) as exc:
            raise LedgerError(f"{self.description}: {_first_line(exc)}") from None

    # -- schema ---------------------------------------------------------------------------------
    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
            conn.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA}.meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = conn.execute(f"SELECT value FROM {SCHEMA}.meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise LedgerError(f"{self.description}: ledger schema {version} is newer than this leakprobe "
                                  f"understands ({SCHEMA_VERSION}); upgrade leakprobe")
            for script in MIGRATIONS[version:]:
                for statement in statements(script):
                    conn.execute(statement)
            conn.execute(f"INSERT INTO {SCHEMA}.meta (key, value) VALUES ('schema_version', %s) ON CONFLICT (key) "
                         "DO UPDATE SET value = EXCLUDED.value", (str(SCHEMA_VERSION),))

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield conn
        except (psycopg.Error, PoolTimeout) as exc:
            raise LedgerError(f"{self.description}: {_first_line(exc)}") from None

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._transaction() as conn:
            return conn.execute(sql, params).fetchall()

    def try_lock(self, name: str) -> JobLock | None:
        try:
            conn = psycopg.connect(self.url, autocommit=True, **self._kwargs)
        except psycopg.Error as exc:
            raise LedgerError(f"{self.description}: {_first_line(exc)}") from None
        try:
            # A replica whose host vanishes sends no FIN: the server's keepalive probes notice within a minute
            # and end the session, which releases the lock.
            for setting, value in LOCK_KEEPALIVE:
                conn.execute(f"SET {setting} = {value}")
            held = conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key(name),)).fetchone()
        except psycopg.Error as exc:
            conn.close()
            raise LedgerError(f"{self.description}: {_first_line(exc)}") from None
        if held and held[0]:
            return PostgresLock(conn)
        conn.close()
        return None

    def close(self) -> None:
        self._pool.close()


def _use_schema(conn: psycopg.Connection[Any]) -> None:
    """Unqualified table names mean ours, so the SQL shared with SQLite needs no schema prefix."""
    conn.execute(f"SET search_path TO {SCHEMA}")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
