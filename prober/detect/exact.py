"""Exact detection: every canary's compact pattern (a token's body through its first piece, a fact's text through
an automaton), plus MAC verification of tokens that this ledger never saw (a replica's, or one from before a
restore) where the tokens' prefix is written."""

from __future__ import annotations

from prober.canaries import tokens
from prober.canaries.compact import original_span
from prober.detect.base import CanarySet, Hit
from prober.detect.patterns import PatternIndex, PieceReader
from prober.domain.evidence import MacVerified
from prober.domain.types import DetectorName, Record, Severity


class ExactDetector(PieceReader):
    """Canary text, modulo case, spacing, separators and look-alike characters."""

    name = DetectorName.EXACT
    rank = 0
    severity = Severity.CRITICAL

    def __init__(self, canaries: CanarySet, patterns: PatternIndex | None = None) -> None:
        self.canaries = canaries
        self.patterns = patterns or PatternIndex(canaries)

    def worth_reading(self, compacted: str) -> bool:
        return self.patterns.others.holds or (self.canaries.key is not None and tokens.COMPACT_PREFIX in compacted)

    def detect(self, record: Record, compacted: str) -> list[Hit]:
        hits: list[Hit] = []
        found = self.patterns.whole_in(compacted)
        for match in found.matches:
            start, stop = original_span(record.text, match.start, match.end)
            hits.append(Hit(self.name, 1.0, start, stop, canary=self.canaries.canaries[match.canary]))
        if self.canaries.key is None or not found.after_prefixes:
            return hits
        known = {(m.start, m.end) for m in found.matches}
        for at in found.after_prefixes:
            body = compacted[at : at + tokens.BODY_LEN]
            if (at, at + len(body)) in known:
                continue  # a known canary, reported above
            verified = tokens.verify(self.canaries.key, body, self.canaries.tenants)
            if verified is not None:
                start, stop = original_span(record.text, at - len(tokens.COMPACT_PREFIX), at + tokens.BODY_LEN)
                hits.append(Hit(self.name, 1.0, start, stop, verified=verified,
                                evidence=(MacVerified(verified.tenant_tag, verified.probe_tag),)))
        return hits
