"""Fuzzy detection: canaries with a few characters changed ("typo fixes", dropped or doubled letters).

Never a scan of every canary per answer: each answer is narrowed to the few canaries that could be in it,
and only those are scored with rapidfuzz's partial_ratio (best alignment of the pattern inside the answer).
A token body is a candidate where one of its six pieces is in the answer (patterns.py: five substitutions leave
one whole), and is scored on the stretch of the answer around that piece -- where that stretch shares at least
24 of the body's characters, the fewest that can score 0.84 (bags.py).  A fact is a candidate where it shares
enough 4-grams with the answer (a 4-gram index over the facts); 4-grams that occur in many facts (template
words) are left out of the index: they say nothing about *which* fact it is.

Thresholds, from `python bench/detect.py` (300 token bodies planted in 2,000-character answers):
1, 3, 4 and 5 substituted characters score 0.969, 0.906, 0.875 and 0.844; the best alignment of a
body against an answer that does not hold it is at most 0.406 (median 0.312).  Tokens hit at 0.84
(up to 5 substitutions, twice the null maximum; bags.TOKEN_THRESHOLD).  Facts are longer, so the same
edits cost less: they hit at 0.88 and additionally need half of their distinctive slot values present
(fuzzy >= 0.85), which keeps a same-template fact of another tenant out (0 of 60 in the evaluation set).
"""

from __future__ import annotations

import numpy as np
from rapidfuzz import fuzz

from prober.canaries.compact import compact, original_span
from prober.detect.bags import SCORABLE, TOKEN_THRESHOLD
from prober.detect.base import CanarySet, Hit
from prober.detect.grams import GramIndex
from prober.detect.patterns import PatternIndex, PieceReader, is_body
from prober.domain.types import CanaryKind, DetectorName, Record, Severity

Q = 4
MAX_POSTINGS = 64  # a 4-gram shared by more canaries than this is not indexed
FACT_THRESHOLD = 0.88
SLOT_THRESHOLD = 0.85


class FuzzyDetector(PieceReader):
    """Canary text with a few characters edited, found through a piece of it that is intact."""

    name = DetectorName.FUZZY
    rank = 1
    severity = Severity.CRITICAL

    def __init__(self, canaries: CanarySet, patterns: PatternIndex | None = None) -> None:
        self.canaries = canaries
        self.patterns = patterns or PatternIndex(canaries)
        self._facts = np.asarray([i for i in range(len(canaries.patterns)) if not is_body(canaries, i)],
                                 dtype=np.int32)
        self._index = GramIndex([canaries.patterns[i] for i in self._facts], Q, MAX_POSTINGS)
        # A fact must share a third of its indexed grams (3 edits in 32 characters leave 17 of 29).
        self._min_shared = np.maximum(2, self._index.indexed // 3)
        self._slots = [[compact(v) for v in c.values] for c in canaries.canaries]

    def worth_reading(self, compacted: str) -> bool:
        return len(self._facts) > 0

    def candidates(self, compacted: str) -> dict[int, tuple[int, int]]:
        """Canary number -> the stretch of the compact answer to score it on."""
        found: dict[int, tuple[int, int]] = {}
        for piece in self.patterns.pieces_in(compacted):
            if piece.shared < SCORABLE:
                continue  # too few of the body's characters around it to score
            start, end = piece.around(len(compacted))
            known = found.get(piece.canary)
            found[piece.canary] = (min(start, known[0]), max(end, known[1])) if known else (start, end)
        if len(self._facts):
            ids, shared = self._index.shared(compacted)
            for fact in self._facts[ids[shared >= self._min_shared[ids]]].tolist():
                found[fact] = (0, len(compacted))
        return found

    def detect(self, record: Record, compacted: str) -> list[Hit]:
        hits: list[Hit] = []
        for index, (begin, stop) in self.candidates(compacted).items():
            canary = self.canaries.canaries[index]
            pattern = self.canaries.patterns[index]
            is_token = canary.kind is CanaryKind.TOKEN
            cutoff = 100 * (TOKEN_THRESHOLD if is_token else FACT_THRESHOLD)
            aligned = fuzz.partial_ratio_alignment(pattern, compacted[begin:stop], score_cutoff=cutoff)
            if aligned is None:
                continue
            first, last = begin + aligned.dest_start, begin + aligned.dest_end
            if not is_token and not self._slots_agree(index, compacted[first:last]):
                continue
            start, end = original_span(record.text, first, last)
            hits.append(Hit(self.name, aligned.score / 100, start, end, canary=canary))
        return hits

    def _slots_agree(self, index: int, window: str) -> bool:
        slots = [s for s in self._slots[index] if s]
        if not slots:
            return True
        present = sum(fuzz.partial_ratio(s, window) >= 100 * SLOT_THRESHOLD for s in slots)
        return 2 * present >= len(slots)
