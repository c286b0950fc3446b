"""Exact detection: canary tokens by a hash of every 32-character window of the compact answer, facts by one
Aho-Corasick pass, plus MAC verification of tokens that this ledger never saw (a replica's, or one from
before a restore).

Tokens are most of the canaries (100,000 at a busy deployment) and all have a 32-character body, so they
need no trie: a sorted array of body hashes (12 bytes a token, where a trie cost about 1.3 KB) is searched
for every window's hash, and a hash hit is confirmed by comparing the text."""

from __future__ import annotations

import ahocorasick
import numpy as np

from prober.canaries import tokens
from prober.canaries.compact import original_span
from prober.detect.base import CanarySet, Detector, Hit
from prober.detect.grams import KeyTable, gram_keys
from prober.types import CanaryKind, Record, Severity

BLOCK = 1024


class ExactDetector(Detector):
    """Canary text, modulo case, spacing, separators and look-alike characters."""

    name = "exact"
    rank = 0
    severity = Severity.CRITICAL

    def __init__(self, canaries: CanarySet) -> None:
        self.canaries = canaries
        patterns = canaries.patterns
        bodies = [i for i, (p, c) in enumerate(zip(patterns, canaries.canaries, strict=True))
                  if c.kind is CanaryKind.TOKEN and len(p) == tokens.BODY_LEN]
        # Hashed a block at a time: one string per block, every BODY_LEN-th window is a body.
        keys = np.concatenate([np.zeros(0, dtype=np.uint64)] + [
            gram_keys("".join(patterns[i] for i in bodies[at : at + BLOCK]), tokens.BODY_LEN)[:: tokens.BODY_LEN]
            for at in range(0, len(bodies), BLOCK)])
        order = np.argsort(keys, kind="stable")
        self._bodies = KeyTable(keys[order])
        self._body_ids = np.asarray(bodies, dtype=np.int32)[order]
        self._automaton = ahocorasick.Automaton()
        in_bodies = set(bodies)
        for index, pattern in enumerate(patterns):
            if pattern and index not in in_bodies:
                existing = self._automaton.get(pattern, ())
                self._automaton.add_word(pattern, (*existing, index))
        if len(self._automaton):
            self._automaton.make_automaton()

    def _bodies_in(self, text: str) -> list[tuple[int, int]]:
        """(start, canary number) of every token body in the compact text (hash hits confirmed by the text)."""
        windows, found = gram_keys(text, tokens.BODY_LEN), []
        for start, key in zip(*self._bodies.find(windows), strict=True):
            index = int(self._body_ids[key])
            if self.canaries.patterns[index] == text[start : start + tokens.BODY_LEN]:
                found.append((int(start), index))
        return sorted(found)

    def detect(self, record: Record, compacted: str) -> list[Hit]:
        hits: list[Hit] = []
        if len(self._bodies):
            for start, index in self._bodies_in(compacted):
                span = original_span(record.text, start, start + tokens.BODY_LEN)
                hits.append(Hit(self.name, 1.0, *span, canary=self.canaries.canaries[index]))
        if len(self._automaton):
            for end, indices in self._automaton.iter(compacted):
                for index in indices:
                    pattern = self.canaries.patterns[index]
                    start, stop = original_span(record.text, end - len(pattern) + 1, end + 1)
                    hits.append(Hit(self.name, 1.0, start, stop, canary=self.canaries.canaries[index]))
        if self.canaries.key is not None and "1PK" in compacted:
            for match in tokens.BODY_AFTER_PREFIX.finditer(compacted):
                body = match.group(1)
                if self._bodies_in(body):
                    continue  # a known canary, reported above
                verified = tokens.verify(self.canaries.key, body, self.canaries.tenants)
                if verified is not None:
                    start, stop = original_span(record.text, match.start(), match.end())
                    hits.append(Hit(self.name, 1.0, start, stop, verified=verified,
                                    details={"verified_by": "mac", "tenant_tag": verified.tenant_tag}))
        return hits
