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

from prober.domain.errors import LedgerError
from prober.ledger.base import JobLock
from prober.ledger.credentials import masked, password_from_file
from prober.ledger.schema import POSTGRES_OFFSET, migrations
from prober.ledger.sql import SQLLedger

SCHEMA = "leakprobe"
MIGRATIONS = migrations("postgres")
SCHEMA_VERSION = len(MIGRATIONS) - POSTGRES_OFFSET
MIGRATION_LOCK = 0x4C50524B  # "LPRK"
LOCK_KEEPALIVE = (("tcp_keepalives_idle", 30), ("tcp_keepalives_interval", 10), ("tcp_keepalives_count", 3))


def lock_key(name: str) -> int:
    """A signed 64-bit advisory-lock key for a name."""
    return int.from_bytes(hashlib.sha256(b"leakprobe\x00" + name.encode()).digest()[:8], "big", signed=True)


class PostgresLock(JobLock):
    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection

    def release(self) -> None:
        """Unlocked before the session closes: a closed session's locks go only when its server process has ended,
        which a busy server does after the next replica has already been refused the lock."""
        try:
            self.connection.execute("SELECT pg_advisory_unlock_all()")
        except psycopg.Error:
            pass  # the session is gone already, and its locks with it
        finally:
            self.connection.close()


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
            conn.execute(f"SET LOCAL search_path TO {SCHEMA}")  # the shared migrations name tables unqualified
            for migration in MIGRATIONS[version + POSTGRES_OFFSET if version else 0 :]:
                for statement in migration:
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
