"""The ledger's operations, written once in the SQL that SQLite (3.35+) and PostgreSQL both speak.

A backend supplies what differs: how it opens a transaction and reads (`_transaction`, `_read`), its
parameter mark (SQL here is written with `?`), the name of its "larger of two" function, its dialect of the
tables (schema.py), and its job locks.  Every write that must be atomic across replicas is one statement: a conditional
upsert with RETURNING (token spend, slot claims), so it needs no lock held between statements.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager, closing
from typing import Any, ClassVar

from prober.domain.incidents import CONTENT_KINDS, COUNTER_KINDS, Acknowledgement, Incident, IncidentKey, RunChecks
from prober.domain.types import Canary, Finding
from prober.ledger.rows import (
    ACK_COLUMNS,
    CANARY_COLUMNS,
    CHECK_COLUMNS,
    FINDING_COLUMNS,
    INCIDENT_KEY,
    SHINGLE_COLUMNS,
    ack_of,
    canary_of,
    canary_row,
    check_of,
    finding_of,
    finding_row,
    incident_of,
    incident_row,
    key_of,
    key_row,
    shingles_of,
    shingles_row,
)
from prober.text.shingles import PromptShingles


class SQLBase(ABC):
    """How a backend reaches its database: a transaction, a read, its parameter mark and its max and min."""

    description: str
    mark: ClassVar[str] = "?"  # the driver's parameter mark
    greatest: ClassVar[str] = "max"  # SQLite's scalar max(); PostgreSQL calls it GREATEST
    least: ClassVar[str] = "min"

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[Any]:
        """A connection inside a transaction (committed on exit, rolled back on error); errors as LedgerError."""

    @abstractmethod
    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Rows of one query (SQL with the driver's marks); errors as LedgerError."""

    def _sql(self, text: str) -> str:
        return text if self.mark == "?" else text.replace("?", self.mark)

    def _select(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._read(self._sql(sql), params)

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """One statement in its own transaction: with RETURNING its first row (None when nothing came back),
        else the number of rows it touched."""
        with self._transaction() as conn, closing(conn.cursor()) as cursor:
            cursor.execute(self._sql(sql), params)
            return cursor.fetchone() if cursor.description else cursor.rowcount


class SQLIncidents(SQLBase):
    """Incidents: grouped findings, the checks that found each and re-checked it clean, operators' acknowledgements."""

    def incidents(self) -> list[Incident]:
        rows = self._select(f"SELECT {INCIDENT_KEY}, severity, first_seen, last_seen, count "
                            "FROM incidents ORDER BY severity DESC, first_seen")
        incidents = [incident_of(row) for row in rows]
        by_key = {i.key: i for i in incidents}
        for row in self._select(f"SELECT {CHECK_COLUMNS} FROM incident_checks ORDER BY last_found"):
            if (incident := by_key.get(key_of(row))) is not None:
                incident.checks.append(check_of(row))
        for row in self._select(f"SELECT {ACK_COLUMNS} FROM incident_acks ORDER BY acked_at, id"):
            if (incident := by_key.get(key_of(row))) is not None:
                incident.ack = ack_of(row)  # the latest one wins
        return incidents

    def record_checks(self, checks: RunChecks, at: float) -> None:
        """In one transaction: the checks that found incidents in this run, then the re-checks it made.  A re-check
        sets `last_clean` only where none came after the last finding: the first clean re-check closes the
        incident, and later ones leave its closing time (and so its resolved notice) where it was.  A run that
        could not see content (no answer carried its own canary) re-checks only what the envelope shows, and a request
        around which the engine's failure counters were not read re-checks nothing that only they show."""
        g = self.greatest
        blind_kinds = ", ".join(f"'{kind.value}'" for kind in sorted(CONTENT_KINDS))
        counter_kinds = ", ".join(f"'{kind.value}'" for kind in sorted(COUNTER_KINDS))
        with self._transaction() as conn, closing(conn.cursor()) as cursor:
            cursor.executemany(self._sql(
                f"INSERT INTO incident_checks ({CHECK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL) "
                f"ON CONFLICT ({INCIDENT_KEY}, job, boundary) DO UPDATE SET "
                "prompt_tokens = CASE WHEN excluded.last_found >= incident_checks.last_found "
                "THEN excluded.prompt_tokens ELSE incident_checks.prompt_tokens END, "
                f"last_found = {g}(incident_checks.last_found, excluded.last_found)"),
                [(*key_row(s.key), checks.job, s.boundary, s.prompt_tokens, s.found_at) for s in checks.sightings])
            cursor.executemany(self._sql(
                "UPDATE incident_checks SET last_clean = ? "
                "WHERE target = ? AND job = ? AND boundary = ? AND observer = ? AND victim IN (?, '') "
                "AND last_found < ? AND (last_clean IS NULL OR last_clean <= last_found) "
                f"AND (? OR kind NOT IN ({blind_kinds})) AND (? OR kind NOT IN ({counter_kinds}))"),
                [(at, checks.target, checks.job, o.boundary, o.observer, o.other, checks.started, o.sighted, o.counted)
                 for o in sorted(checks.observations, key=lambda o: (o.boundary, o.observer, o.other))])

    def acknowledge(self, key: IncidentKey, ack: Acknowledgement) -> bool:
        """Record an operator's acknowledgement; False (nothing written) when there is no such incident."""
        added: int = self._execute(
            f"INSERT INTO incident_acks ({ACK_COLUMNS}) SELECT ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM "
            "incidents WHERE target = ? AND kind = ? AND victim = ? AND observer = ?)",
            (*key_row(key), ack.at, ack.by, ack.note, *key_row(key)))
        return added > 0


class SQLLedger(SQLIncidents):
    # -- canaries -------------------------------------------------------------------------------
    def add_canaries(self, canaries: Sequence[Canary]) -> None:
        with self._transaction() as conn, closing(conn.cursor()) as cursor:
            cursor.executemany(self._sql(_insert("canaries", CANARY_COLUMNS)), [canary_row(c) for c in canaries])

    def keep_canaries(self, canaries: Sequence[Canary]) -> None:
        kept = (f"{_insert('canaries', CANARY_COLUMNS)} ON CONFLICT (id) DO UPDATE SET "
                f"expires_at = {self.greatest}(canaries.expires_at, excluded.expires_at)")
        with self._transaction() as conn, closing(conn.cursor()) as cursor:
            cursor.executemany(self._sql(kept), [canary_row(c) for c in canaries])

    def active_canaries(self, now: float | None = None, created_since: float | None = None) -> list[Canary]:
        now = time.time() if now is None else now
        rows = self._select(f"SELECT {CANARY_COLUMNS} FROM canaries WHERE expires_at >= ? AND created_at >= ? "
                            "ORDER BY created_at, id", (now, created_since or 0.0))
        return [canary_of(row) for row in rows]

    def get_canary(self, canary_id: str) -> Canary | None:
        rows = self._select(f"SELECT {CANARY_COLUMNS} FROM canaries WHERE id = ?", (canary_id,))
        return canary_of(rows[0]) if rows else None

    def purge_expired(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        self._execute("DELETE FROM prompt_shingles WHERE expires_at < ?", (now,))
        purged: int = self._execute("DELETE FROM canaries WHERE expires_at < ?", (now,))
        return purged

    # -- prompt shingles ------------------------------------------------------------------------
    def add_prompt_shingles(self, records: Sequence[PromptShingles]) -> None:
        with self._transaction() as conn, closing(conn.cursor()) as cursor:
            cursor.executemany(self._sql(_insert("prompt_shingles", SHINGLE_COLUMNS)),
                               [shingles_row(r) for r in records])

    def prompt_shingles(self, now: float | None = None, created_since: float | None = None) -> list[PromptShingles]:
        rows = self._select(f"SELECT {SHINGLE_COLUMNS} FROM prompt_shingles WHERE expires_at >= ? AND created_at >= ? "
                            "ORDER BY id", (time.time() if now is None else now, created_since or 0.0))
        return [shingles_of(row) for row in rows]

    # -- findings and incidents -----------------------------------------------------------------
    def add_findings(self, findings: Sequence[Finding]) -> None:
        """The findings and their incidents' new counts, in one transaction."""
        now = time.time()
        with self._transaction() as conn, closing(conn.cursor()) as cursor:
            cursor.executemany(self._sql(_insert("findings", FINDING_COLUMNS)), [finding_row(f, now) for f in findings])
            cursor.executemany(self._sql(
                "INSERT INTO incidents (target, kind, victim, observer, severity, first_seen, last_seen, count) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT (target, kind, victim, observer) DO UPDATE SET "
                f"severity = {self.greatest}(incidents.severity, excluded.severity), "
                f"first_seen = {self.least}(incidents.first_seen, excluded.first_seen), "
                f"last_seen = {self.greatest}(incidents.last_seen, excluded.last_seen), "
                "count = incidents.count + 1"), [incident_row(f, now) for f in findings])

    def findings(self) -> list[Finding]:
        return [finding_of(row) for row in self._select(f"SELECT {FINDING_COLUMNS} FROM findings ORDER BY id")]

    # -- token spend ----------------------------------------------------------------------------
    def spend_tokens(self, target: str, day: str, tokens: int, limit: int) -> bool:
        row = self._execute(
            "INSERT INTO token_spend (target, day, tokens) SELECT ?, ?, ? WHERE ? <= ? "
            "ON CONFLICT (target, day) DO UPDATE SET tokens = token_spend.tokens + excluded.tokens "
            "WHERE token_spend.tokens + excluded.tokens <= ? RETURNING tokens",
            (target, day, tokens, tokens, limit, limit))
        return row is not None

    def refund_tokens(self, target: str, day: str, tokens: int) -> None:
        self._execute(f"UPDATE token_spend SET tokens = {self.greatest}(0, tokens - ?) WHERE target = ? AND day = ?",
                      (tokens, target, day))

    def tokens_spent(self, target: str, day: str) -> int:
        rows = self._select("SELECT tokens FROM token_spend WHERE target = ? AND day = ?", (target, day))
        return int(rows[0][0]) if rows else 0

    # -- meta and scheduled slots ---------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        rows = self._select("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta_if_absent(self, key: str, value: str) -> str:
        with self._transaction() as conn, closing(conn.cursor()) as cursor:
            cursor.execute(self._sql("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"),
                           (key, value))
            cursor.execute(self._sql("SELECT value FROM meta WHERE key = ?"), (key,))
            return str(cursor.fetchone()[0])

    def set_meta(self, key: str, value: str) -> None:
        self._execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = "
                      "excluded.value", (key, value))

    def claim_slot(self, key: str, at: float, not_since: float) -> bool:
        row = self._execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value "
            "WHERE CAST(meta.value AS DOUBLE PRECISION) < ? RETURNING value", (key, repr(at), not_since))
        return row is not None

    def check_writable(self) -> None:
        self.set_meta("last_write_check", repr(time.time()))

    def identity_problem(self) -> str | None:
        """A server is reached by address: it cannot be swapped under an open connection (a file can)."""
        return None

    def recover(self, keep_aside: bool = False) -> str | None:
        return None


def _insert(table: str, columns: str) -> str:
    return f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' * len(columns.split(',')))})"
