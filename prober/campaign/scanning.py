"""Scanning answers against every canary the ledger knows, including those minted during this run.

Building a scanner costs time in proportion to its canaries, so the ledger's older canaries get one scanner
for the whole run and this run's canaries a small one, rebuilt only when new canaries were minted."""

from __future__ import annotations

from collections.abc import Sequence

from prober.detect import Scanner
from prober.detect.embedder import Embedder
from prober.detect.scanner import ScanResult
from prober.types import Canary, Record


class RunScanner:
    def __init__(self, earlier: Sequence[Canary], *, key: bytes, tenants: Sequence[str],
                 embedder: Embedder | None = None) -> None:
        self.key = key
        self.tenants = list(tenants)
        self.embedder = embedder
        self._earlier = (Scanner(earlier, key=key, tenants=tenants, embedder=embedder, foreign=False)
                         if earlier else None)
        self._minted: dict[str, Canary] = {}
        self._current: Scanner | None = None

    def add(self, canaries: Sequence[Canary]) -> None:
        fresh = [c for c in canaries if c.id not in self._minted]
        if fresh:
            self._minted.update((c.id, c) for c in fresh)
            self._current = None

    def scan(self, record: Record) -> ScanResult:
        if self._current is None:
            self._current = Scanner(list(self._minted.values()), key=self.key, tenants=self.tenants,
                                    embedder=self.embedder)
        result = self._current.scan(record)
        if self._earlier is None:
            return result
        older = self._earlier.scan(record)
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
