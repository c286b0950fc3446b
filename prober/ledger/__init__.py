"""Where canaries, findings, incidents and token spend are recorded so that none is ever lost."""

from __future__ import annotations

from pathlib import Path

from prober.ledger.base import Ledger, LedgerError
from prober.ledger.sqlite import SQLiteLedger

__all__ = ["Ledger", "LedgerError", "SQLiteLedger", "open_ledger"]


def open_ledger(url: str | Path) -> Ledger:
    """The ledger at `url`: a file path, or `sqlite:///relative/path` / `sqlite:////absolute/path` (SQLAlchemy's
    spelling), created if absent."""
    text = str(url)
    if text.startswith(("postgres://", "postgresql://")):
        raise LedgerError("the PostgreSQL ledger backend is not available in this version; use a file path")
    return SQLiteLedger(Path(text.removeprefix("sqlite:///")))
