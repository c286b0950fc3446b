"""Where canaries, findings, incidents and token spend are recorded so that none is ever lost.

`open_ledger` picks the backend by URL; nothing above this package knows which one it talks to."""

from __future__ import annotations

from pathlib import Path

from prober.ledger.base import JobLock, Ledger, LedgerError
from prober.ledger.credentials import is_shared, ledger_password, masked
from prober.ledger.sqlite import SQLiteLedger

__all__ = ["JobLock", "Ledger", "LedgerError", "SQLiteLedger", "is_shared", "ledger_password", "masked", "open_ledger"]


def open_ledger(url: str | Path) -> Ledger:
    """The ledger at `url`: `postgresql://user@host:port/db` (password in the URL, PGPASSWORD or the file
    LEAKPROBE_LEDGER_PASSWORD_FILE names), a file path, or `sqlite:///relative/path` /
    `sqlite:////absolute/path` (SQLAlchemy's spelling); a file is created if absent."""
    text = str(url)
    if is_shared(text):
        from prober.ledger.postgres import PostgresLedger  # psycopg is imported only when it is used

        return PostgresLedger(text)
    return SQLiteLedger(Path(text.removeprefix("sqlite:///")))
