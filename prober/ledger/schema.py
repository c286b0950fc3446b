"""The ledger's tables, written once for SQLite and PostgreSQL.

Each migration is SQL both engines speak, with the few type names that differ as fields (`DIALECTS`).  The
migrations are applied in order and never edited once released; a ledger records how many it has.
PostgreSQL ledgers began at migration 3 (their first version created migrations 1 to 3 in one step), so a
PostgreSQL ledger's version is `POSTGRES_OFFSET` less than the migrations it holds.
"""

from __future__ import annotations

from typing import Literal

Dialect = Literal["sqlite", "postgres"]

DIALECTS: dict[Dialect, dict[str, str]] = {
    "sqlite": {"real": "REAL", "blob": "BLOB", "serial": "INTEGER PRIMARY KEY AUTOINCREMENT", "count": "INTEGER"},
    "postgres": {"real": "DOUBLE PRECISION", "blob": "BYTEA", "serial": "BIGSERIAL PRIMARY KEY", "count": "BIGINT"},
}
POSTGRES_OFFSET = 2

_MIGRATIONS = [
    # 1: canaries, findings, meta
    """
    CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE canaries (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('token', 'fact')),
        text TEXT NOT NULL,
        probe_id TEXT NOT NULL DEFAULT '',
        pack TEXT NOT NULL DEFAULT '',
        slots TEXT NOT NULL DEFAULT '[]',
        created_at {real} NOT NULL,
        expires_at {real} NOT NULL,
        embedding {blob},
        embedding_model TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX canaries_by_expiry ON canaries (expires_at);
    CREATE TABLE findings (
        id {serial},
        created_at {real} NOT NULL,
        target TEXT NOT NULL DEFAULT '',
        record_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        detector TEXT NOT NULL,
        severity TEXT NOT NULL,
        score {real} NOT NULL,
        observer_tenant TEXT NOT NULL,
        victim_tenant TEXT,
        canary_id TEXT,
        probe_id TEXT,
        start_offset INTEGER NOT NULL,
        end_offset INTEGER NOT NULL,
        excerpt TEXT NOT NULL,
        excerpt_sha256 TEXT NOT NULL,
        redacted INTEGER NOT NULL,
        details TEXT NOT NULL DEFAULT '{{}}'
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
        first_seen {real} NOT NULL,
        last_seen {real} NOT NULL,
        count {count} NOT NULL,
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
        tokens {count} NOT NULL,
        PRIMARY KEY (target, day)
    )
    """,
    # 3: other spellings of a fact's slot values (romanized Korean), for leaks across languages
    """
    ALTER TABLE canaries ADD COLUMN aliases TEXT NOT NULL DEFAULT '[]'
    """,
    # 4: the probes that found each incident and when they re-checked it clean; operators' acknowledgements
    """
    CREATE TABLE incident_probes (
        target TEXT NOT NULL,
        kind TEXT NOT NULL,
        victim TEXT NOT NULL,
        observer TEXT NOT NULL,
        job TEXT NOT NULL,
        boundary TEXT NOT NULL,
        prompt_tokens {count},
        last_found {real} NOT NULL,
        last_clean {real},
        PRIMARY KEY (target, kind, victim, observer, job, boundary)
    );
    CREATE INDEX incident_probes_by_check ON incident_probes (target, job, boundary, observer);
    CREATE TABLE incident_acks (
        id {serial},
        target TEXT NOT NULL,
        kind TEXT NOT NULL,
        victim TEXT NOT NULL,
        observer TEXT NOT NULL,
        acked_at {real} NOT NULL,
        acked_by TEXT NOT NULL,
        note TEXT NOT NULL DEFAULT ''
    )
    """,
    # 5: keyed hashes of the word shingles of every prompt sent (to attribute verbatim runs of a stale prompt)
    """
    CREATE TABLE prompt_shingles (
        id {serial},
        tenant TEXT NOT NULL,
        probe_id TEXT NOT NULL,
        created_at {real} NOT NULL,
        expires_at {real} NOT NULL,
        hashes {blob} NOT NULL
    );
    CREATE INDEX prompt_shingles_by_expiry ON prompt_shingles (expires_at)
    """,
    # 6: canaries by age, for the index's incremental reads (PostgreSQL ledgers had it from their start)
    """
    CREATE INDEX IF NOT EXISTS canaries_by_creation ON canaries (created_at)
    """,
    # 7: what found an incident is a check (a job at a boundary); "probe" is a request's role
    """
    ALTER TABLE incident_probes RENAME TO incident_checks;
    DROP INDEX incident_probes_by_check;
    CREATE INDEX incident_checks_by_run ON incident_checks (target, job, boundary, observer)
    """,
    # 8: the probe shape and the prefix cache became jobs of their own (they were the campaign's): an open incident
    # waits for the job that now re-checks its boundary
    """
    UPDATE incident_checks SET job = 'prefix-cache' WHERE job = 'campaign' AND boundary IN ('prefix-cache', 'repeat');
    UPDATE incident_checks SET job = 'shapes' WHERE job = 'campaign' AND boundary LIKE 'shape:%'
    """,
]


def migrations(dialect: Dialect) -> list[list[str]]:
    """Every migration's statements, in order, in `dialect`'s type names."""
    return [[s for s in script.format(**DIALECTS[dialect]).split(";") if s.strip()] for script in _MIGRATIONS]
