"""SQLite ledger: WAL journal, synchronous=FULL commits, versioned schema, refuses foreign files.

The file is marked with `PRAGMA application_id` so that leakprobe never silently adopts a database that
some other program wrote.  The mark is read through a read-only connection before anything is written, so
a refused file is left byte for byte as it was (no journal mode switched, no -wal or -shm created).
`PRAGMA user_version` holds the schema version; migrations run forward in one transaction.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prober.domain.errors import LedgerError
from prober.ledger.base import JobLock
from prober.ledger.schema import migrations
from prober.ledger.sql import SQLLedger

APPLICATION_ID = 0x4C50524B  # "LPRK"

MIGRATIONS = migrations("sqlite")
SCHEMA_VERSION = len(MIGRATIONS)


class _FileLock(JobLock):
    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


class _ThreadLock(JobLock):
    def __init__(self, lock: threading.Lock) -> None:
        self._lock: threading.Lock | None = lock

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


class SQLiteLedger(SQLLedger):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.description = str(path)
        self._lock = threading.Lock()
        self._memory_locks: dict[str, threading.Lock] = {}
        self._in_memory = str(path) == ":memory:"
        try:
            if not self._in_memory and path.exists():
                refuse_foreign(path)
            if not self._in_memory:
                path.parent.mkdir(parents=True, exist_ok=True)
            self._db = self._connect()
            self._migrate()
            self._identity = self._file_identity()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{path}: not a usable leakprobe ledger ({exc})") from None
        except (OSError, ValueError) as exc:
            raise LedgerError(f"{path}: cannot open ledger ({exc})") from None

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    # -- the file under it ----------------------------------------------------------------------
    def _file_identity(self) -> tuple[int, int] | None:
        if self._in_memory:
            return None
        st = os.stat(self.path)
        return st.st_dev, st.st_ino

    def identity_problem(self) -> str | None:
        """The file at the path is no longer the one this ledger opened: writes would go to a deleted inode (lost
        at exit) or beside a file someone else put there."""
        if self._identity is None:
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return f"{self.path}: the ledger file was deleted while open (this process still holds its contents)"
        except OSError as exc:
            return f"{self.path}: cannot check the ledger file ({exc.strerror})"
        if (st.st_dev, st.st_ino) != self._identity:
            return f"{self.path}: the ledger file was replaced by another file while open"
        return None

    def check_writable(self) -> None:
        problem = self.identity_problem()
        if problem is not None:
            raise LedgerError(problem)
        super().check_writable()

    def recover(self, keep_aside: bool = False) -> str | None:
        """After the file was deleted: write the copy this process holds open (every canary and finding it
        recorded) back to the path and carry on there.  A file put in its place is never overwritten; with
        `keep_aside` (at exit) the open copy is saved beside it instead.  None when there was nothing to do."""
        with self._lock:
            if self.identity_problem() is None:
                return None
            if self.path.exists():
                if not keep_aside:
                    return None
                aside = self.path.with_name(f"{self.path.name}.orphaned-{int(time.time())}")
                copy_to(self._db, aside)
                return f"{self.path} was replaced by another file; what this process recorded is saved in {aside}"
            restoring = self.path.with_name(f"{self.path.name}.restoring-{os.getpid()}")
            try:
                copy_to(self._db, restoring)
                os.replace(restoring, self.path)
                fresh = self._connect()
            except (OSError, sqlite3.Error) as exc:
                raise LedgerError(f"{self.path}: cannot restore the ledger file ({exc})") from None
            self._db.close()
            self._db, self._identity = fresh, self._file_identity()
            return f"{self.path} was deleted while open; restored from the copy this process held"

    # -- schema ---------------------------------------------------------------------------------
    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        with self._transaction():
            for migration in MIGRATIONS[version:]:
                for statement in migration:
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

    def try_lock(self, name: str) -> JobLock | None:
        """An exclusive flock on a file beside the ledger (daemons on one machine may share a file), released
        when the job ends or by the kernel when the process dies; in memory, a lock of this ledger object."""
        if self._in_memory:
            held = self._memory_locks.setdefault(name, threading.Lock())
            return _ThreadLock(held) if held.acquire(blocking=False) else None
        folder = self.path.with_name(self.path.name + ".locks")
        try:
            folder.mkdir(exist_ok=True)
            fd = os.open(folder / hashlib.sha256(name.encode()).hexdigest()[:24], os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise LedgerError(f"{self.description}: cannot create a job lock: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return _FileLock(fd)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def refuse_foreign(path: Path) -> None:
    """Read-only: refuse a file another program wrote, or a newer schema, before touching it."""
    uri = f"{path.resolve().as_uri()}?mode=ro"
    probe = sqlite3.connect(uri, uri=True)
    try:
        app_id = probe.execute("PRAGMA application_id").fetchone()[0]
        version = probe.execute("PRAGMA user_version").fetchone()[0]
        tables = probe.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    finally:
        probe.close()
    if app_id != APPLICATION_ID and (app_id != 0 or tables):
        raise LedgerError(f"{path}: this SQLite file belongs to another program "
                          f"(application_id {app_id:#x}); refusing to use it as a ledger")
    if version > SCHEMA_VERSION:
        raise LedgerError(f"{path}: ledger schema {version} is newer than this leakprobe "
                          f"understands ({SCHEMA_VERSION}); upgrade leakprobe")


def copy_to(db: sqlite3.Connection, path: Path) -> None:
    """The open database as one self-contained file at `path`, on disk before it returns."""
    copy = sqlite3.connect(path)
    try:
        db.backup(copy)
        copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file (WAL again once reopened)
    finally:
        copy.close()
    with open(path, "rb") as written:
        os.fsync(written.fileno())
