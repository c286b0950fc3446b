"""Scanning answers against every canary the ledger knows, including those minted moments ago.

Building a scanner costs time in proportion to its canaries, so the ledger's canaries get one scanner
(rebuilt by `refresh`, which a long-running daemon calls on an interval to pick up other replicas'
canaries) and this process's new canaries a small one, rebuilt only when canaries were minted.  Once the
small one holds FOLD_AT canaries they are folded into the large one, so a daemon that mints a few canaries a
minute for days never rebuilds a large index per mint.  Scans run in worker threads: indexes are built
outside the lock and swapped in under it, and a scan uses the pair it took.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from prober.canaries.mint import Minter
from prober.detect import CanarySet, Scanner
from prober.detect.scanner import ScanResult
from prober.domain.types import Canary, Record
from prober.embeddings import Embedder
from prober.system.malloc import trim
from prober.text.shingles import PromptShingles

FOLD_AT = 256


class RunScanner:
    def __init__(self, known: Sequence[Canary], *, key: bytes, tenants: Sequence[str],
                 embedder: Embedder | None = None, prompts: Sequence[PromptShingles] = ()) -> None:
        """`prompts`: the ledger's record of sent prompts (verbatim runs of them are attributed); this process's
        new ones come through `add_prompts` and are folded in with the minted canaries."""
        self.key = key
        self.tenants = list(tenants)
        self.embedder = embedder
        self._lock = threading.Lock()
        self._folding = False
        self._known_canaries: list[Canary] = []
        self._known_ids: frozenset[str] = frozenset()
        self._known: Scanner | None = None
        self._minted: dict[str, Canary] = {}
        self._known_prompts = list(prompts)
        self._new_prompts: list[PromptShingles] = []
        self._current: Scanner | None = None
        self.refresh(known)

    @property
    def canaries(self) -> int:
        with self._lock:
            return len(self._known_ids) + len(self._minted)

    def refresh(self, known: Sequence[Canary]) -> None:
        """Replace the ledger's part (built here, in the caller's thread, then swapped in)."""
        scanner = (Scanner(CanarySet(known, key=self.key, tenants=self.tenants), prompts=self._known_prompts,
                           embedder=self.embedder, foreign=False) if known or self._known_prompts else None)
        ids = frozenset(c.id for c in known)
        with self._lock:
            self._known, self._known_ids, self._known_canaries = scanner, ids, list(known)
            if ids & self._minted.keys():
                self._minted = {i: c for i, c in self._minted.items() if i not in ids}
                self._current = None
        trim()  # the index this replaced is garbage now: give its memory back

    def _fold(self) -> None:
        """Move the minted canaries into the large index (in this worker thread, outside the lock)."""
        with self._lock:
            if self._folding or len(self._minted) < FOLD_AT:
                return
            self._folding = True
            known = self._known_canaries + list(self._minted.values())
            self._known_prompts, self._new_prompts = self._known_prompts + self._new_prompts, []
        try:
            self.refresh(known)
        finally:
            with self._lock:
                self._folding = False

    def add(self, canaries: Sequence[Canary]) -> None:
        with self._lock:
            fresh = [c for c in canaries if c.id not in self._minted and c.id not in self._known_ids]
            if fresh:
                self._minted.update((c.id, c) for c in fresh)
                self._current = None

    def add_prompts(self, records: Sequence[PromptShingles]) -> None:
        with self._lock:
            self._new_prompts.extend(records)
            self._current = None

    def _pair(self) -> tuple[Scanner, Scanner | None]:
        with self._lock:
            if self._current is None:
                self._current = Scanner(CanarySet(list(self._minted.values()), key=self.key, tenants=self.tenants),
                                        prompts=self._new_prompts, embedder=self.embedder)
            return self._current, self._known

    def scan(self, record: Record) -> ScanResult:
        self._fold()
        current, known = self._pair()
        result = current.scan(record)
        if known is None:
            return result
        older = known.scan(record)
        # Each scanner MAC-verifies the other's tokens without knowing their canary ids: keep the finding
        # that names the canary, and one of any unnamed findings over the same text.
        merged = result.findings + older.findings
        named = [(f.start, f.end) for f in merged if f.canary_id]
        seen: set[tuple[int, int, str]] = set()
        result.findings = []
        for finding in merged:
            span = (finding.start, finding.end, finding.kind.value)
            if finding.canary_id or not (span in seen or any(s < finding.end and finding.start < e
                                                             for s, e in named)):
                result.findings.append(finding)
                seen.add(span)
        result.own_echoes.extend(older.own_echoes)
        return result


async def ledger_scanner(minter: Minter, tenants: Sequence[str], *, read: bool = True) -> RunScanner:
    """A run's scanner over every canary and sent prompt the minter's ledger holds, read and indexed in worker
    threads (`read=False`: over none, for a run that sends nothing and so scans nothing)."""
    known = await asyncio.to_thread(minter.ledger.active_canaries) if read else []
    prompts = await asyncio.to_thread(minter.ledger.prompt_shingles) if read else []
    return await asyncio.to_thread(RunScanner, known, key=minter.key, tenants=tenants, embedder=minter.embedder,
                                   prompts=prompts)
