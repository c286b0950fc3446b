"""Where canaries, findings, incidents and token spend are recorded so that none is ever lost.

`open_ledger` picks the backend by URL; nothing above this package knows which one it talks to."""

from __future__ import annotations

from pathlib import Path

from prober.ledger.base import JobLock, Ledger
from prober.ledger.credentials import is_shared, ledger_password, masked
from prober.ledger.location import LedgerLocation
from prober.ledger.sqlite import SQLiteLedger

__all__ = ["JobLock", "Ledger", "LedgerLocation", "SQLiteLedger", "is_shared", "ledger_password", "masked",
           "open_ledger"]


def open_ledger(where: str | Path | LedgerLocation) -> Ledger:
    """The ledger at `where` (see `LedgerLocation`); a file is created if absent.  A PostgreSQL password comes
    from the URL, PGPASSWORD or the file LEAKPROBE_LEDGER_PASSWORD_FILE names."""
    location = LedgerLocation.parse(where)
    if location.url is not None:
        from prober.ledger.postgres import PostgresLedger  # psycopg is imported only when it is used

        return PostgresLedger(location.url)
    assert location.path is not None
    return SQLiteLedger(location.path)
