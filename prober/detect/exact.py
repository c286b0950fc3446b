"""Exact detection: one Aho-Corasick pass over the compact form, plus MAC verification of tokens
that this ledger never saw (a replica's, or one from before a restore)."""

from __future__ import annotations

import ahocorasick

from prober.canaries import tokens
from prober.canaries.compact import original_span
from prober.detect.base import CanarySet, Detector, Hit
from prober.types import CanaryKind, Record, Severity


class ExactDetector(Detector):
    """Canary text, modulo case, spacing, separators and look-alike characters."""

    name = "exact"
    rank = 0
    severity = Severity.CRITICAL

    def __init__(self, canaries: CanarySet) -> None:
        self.canaries = canaries
        self._automaton = ahocorasick.Automaton()
        for index, pattern in enumerate(canaries.patterns):
            if pattern:
                existing = self._automaton.get(pattern, ())
                self._automaton.add_word(pattern, (*existing, index))
        if len(self._automaton):
            self._automaton.make_automaton()
        self._known_bodies = {p for p, c in zip(canaries.patterns, canaries.canaries, strict=True)
                              if c.kind is CanaryKind.TOKEN}

    def detect(self, record: Record, compacted: str) -> list[Hit]:
        hits: list[Hit] = []
        if len(self._automaton):
            for end, indices in self._automaton.iter(compacted):
                for index in indices:
                    pattern = self.canaries.patterns[index]
                    start, stop = original_span(record.text, end - len(pattern) + 1, end + 1)
                    hits.append(Hit(self.name, 1.0, start, stop, canary=self.canaries.canaries[index]))
        if self.canaries.key is not None and "1PK" in compacted:
            for match in tokens.BODY_AFTER_PREFIX.finditer(compacted):
                body = match.group(1)
                if body in self._known_bodies:
                    continue
                verified = tokens.verify(self.canaries.key, body, self.canaries.tenants)
                if verified is not None:
                    start, stop = original_span(record.text, match.start(), match.end())
                    hits.append(Hit(self.name, 1.0, start, stop, verified=verified,
                                    details={"verified_by": "mac", "tenant_tag": verified.tenant_tag}))
        return hits
