"""The ledger interface: where canaries, findings, incidents and token spend are kept so none is ever lost.

Every backend (SQLite file, PostgreSQL server) implements it and maps its own errors to `LedgerError`, so
nothing above this interface knows which database it talks to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from prober.domain.incidents import Acknowledgement, Incident, IncidentKey, RunChecks
from prober.domain.types import Canary, Finding
from prober.text.shingles import PromptShingles


class JobLock:
    """Held while one replica runs one job; released when the job ends or the replica dies."""

    def release(self) -> None:
        """Nothing to release where a ledger serves one process."""


class Ledger(Protocol):
    description: str  # where it is, for messages (never a password)

    def add_canaries(self, canaries: Sequence[Canary]) -> None:
        """Persist durably; when this returns, the canaries survive a crash (write-before-send)."""

    def keep_canaries(self, canaries: Sequence[Canary]) -> None:
        """Persist canaries that keep their id from run to run (a canary adapter's): one not kept yet is added, one
        kept already lives until the later of the two expiries.  Durable when this returns, as `add_canaries`."""

    def active_canaries(self, now: float | None = None, created_since: float | None = None) -> list[Canary]:
        """Canaries not yet past their retention (only those created at or after `created_since`, when given)."""

    def get_canary(self, canary_id: str) -> Canary | None: ...

    def add_prompt_shingles(self, records: Sequence[PromptShingles]) -> None:
        """Persist what each sent prompt leaves (keyed hashes of its word shingles, never its text)."""

    def prompt_shingles(self, now: float | None = None, created_since: float | None = None) -> list[PromptShingles]:
        """Prompt shingles not yet past their retention (only those created at or after `created_since`)."""

    def add_findings(self, findings: Sequence[Finding]) -> None:
        """Persist durably, with evidence, and fold each into its incident, in one transaction."""

    def findings(self) -> list[Finding]: ...

    def incidents(self) -> list[Incident]:
        """Every incident (without its findings, with its probes and latest acknowledgement), worst first."""

    def record_checks(self, checks: RunChecks, at: float) -> None:
        """What a job run found (which probe, at what prompt length) and re-checked clean at `at`, in one
        transaction (see prober.domain.incidents.RunChecks)."""

    def acknowledge(self, key: IncidentKey, ack: Acknowledgement) -> bool:
        """An operator's acknowledgement, kept with who and when; False when no such incident exists."""

    def purge_expired(self, now: float | None = None) -> int:
        """Forget canaries and prompt shingles past retention; returns how many canaries."""

    def spend_tokens(self, target: str, day: str, tokens: int, limit: int) -> bool:
        """Add `tokens` to the day's spend of `target` if the total stays within `limit` (atomic; False and
        nothing added otherwise)."""

    def refund_tokens(self, target: str, day: str, tokens: int) -> None: ...

    def tokens_spent(self, target: str, day: str) -> int: ...

    def get_meta(self, key: str) -> str | None: ...

    def set_meta_if_absent(self, key: str, value: str) -> str:
        """Store value unless the key exists; return the stored value (race-free)."""

    def set_meta(self, key: str, value: str) -> None: ...

    def claim_slot(self, key: str, at: float, not_since: float) -> bool:
        """Set `key` to `at` unless it already holds a time at or after `not_since` (atomic): the first
        replica to start a scheduled run claims its slot, and the others skip it."""

    def try_lock(self, name: str) -> JobLock | None:
        """The lock of `name` if no one holds it (never waits)."""

    def check_writable(self) -> None:
        """Raise LedgerError unless a write would succeed now, to the ledger this process opened."""

    def identity_problem(self) -> str | None:
        """Why the ledger is no longer the one opened (its file deleted or replaced), cheaply; None when it is."""

    def recover(self, keep_aside: bool = False) -> str | None:
        """Make the ledger usable again after an identity problem without losing what this process recorded
        (see SQLiteLedger.recover); what was done, or None."""

    def close(self) -> None: ...
