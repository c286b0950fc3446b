"""Where canaries and findings are recorded so that none is ever lost."""

from prober.ledger.base import Ledger, LedgerError
from prober.ledger.sqlite import SQLiteLedger, open_ledger

__all__ = ["Ledger", "LedgerError", "SQLiteLedger", "open_ledger"]
