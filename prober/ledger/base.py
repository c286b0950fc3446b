"""The ledger interface.  SQLite implements it; a PostgreSQL backend can implement it later."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from prober.types import Canary, Finding


class LedgerError(Exception):
    """The ledger cannot be used (corrupt, foreign, too new, unwritable)."""


class Ledger(Protocol):
    def add_canaries(self, canaries: Sequence[Canary]) -> None:
        """Persist durably; when this returns, the canaries survive a crash (write-before-send)."""

    def active_canaries(self, now: float | None = None) -> list[Canary]:
        """Canaries not yet past their retention."""

    def get_canary(self, canary_id: str) -> Canary | None: ...

    def add_findings(self, findings: Sequence[Finding], target: str = "") -> None:
        """Persist durably, with evidence."""

    def findings(self) -> list[Finding]: ...

    def purge_expired(self, now: float | None = None) -> int:
        """Forget canaries past retention; returns how many."""

    def get_meta(self, key: str) -> str | None: ...

    def set_meta_if_absent(self, key: str, value: str) -> str:
        """Store value unless the key exists; return the stored value (race-free)."""

    def close(self) -> None: ...
