"""Semantic detection: a canary fact that a model reworded.

Cosine similarity alone cannot tell two tenants' facts from one template apart (measured up to 0.68
with MiniLM), so attribution rests on the distinctive slot values, and the embedding confirms that
the sentence around them still says the fact:

1. an Aho-Corasick pass over the compact answer (values.py) finds the facts whose slot values (or the parts
   of multi-word values, or their other spellings: a Korean name romanized in an English answer) appear --
   most answers stop here, with no embedding at all; a value counts only as a whole word of the answer
   ("Kaiken" is not in "Kaikenix"; a Korean particle may follow), only together with the fact's other
   values within about twice the fact's length, and one of them must be *strong*: a number, a name in
   full, or a Korean value -- a surname and a place name alone recur across a few hundred facts (measured:
   two false findings in about 15 audits of the `fixed` preset before this rule);
2. for each candidate, chunks around the slot hits are embedded: the sentence that holds them, and where the
   sentence does not confirm the fact, a window of about the fact's length, so a fact run into a long sentence
   is not diluted;
3. the chunks of a batch of answers are embedded in one call, and each chunk's cosine with its own fact gives
   the best per candidate; a hit needs it above the threshold *and* half of the slot values present (a long
   value written with an edit or two counts, next to a value written as it is).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt
from rapidfuzz import fuzz

from prober.canaries.compact import compact, original_span
from prober.detect.base import CanarySet, Detector, Hit, sentence_around, whole_word
from prober.detect.values import SlotValues, ValueHit, strong
from prober.domain.evidence import Retold
from prober.domain.types import DetectorName, Record, Severity
from prober.embeddings import Embedder, Vectors

SPREAD = 2  # a fact's values must lie within SPREAD times its length of each other
NEAR_MIN = 8  # compact length of a value that may count written with an edit (numbers and short words may not)
NEAR_SCORE = 90  # partial_ratio of such a value against the answer (one edit in 10+ characters)


class SemanticDetector(Detector):
    """A canary fact paraphrased: slot values agree and the sentence means the same."""

    name = DetectorName.SEMANTIC
    rank = 2
    severity = Severity.HIGH

    def __init__(self, canaries: CanarySet, embedder: Embedder, values: SlotValues | None = None) -> None:
        self.canaries = canaries
        self.embedder = embedder
        self.threshold = embedder.threshold
        embedder.load()
        self._facts = canaries.facts()
        self._slot_count = {i: len(canaries.canaries[i].values) for i in self._facts}
        self.values = values or SlotValues(canaries)
        self._vectors = self._fact_vectors()

    def _fact_vectors(self) -> dict[int, Vectors]:
        """Stored embeddings where they came from this model; the rest are embedded now."""
        vectors: dict[int, Vectors] = {}
        missing = []
        for index in self._facts:
            canary = self.canaries.canaries[index]
            if canary.embedding and canary.embedding_model == self.embedder.name:
                vectors[index] = np.frombuffer(canary.embedding, dtype=np.float32)
            else:
                missing.append(index)
        if missing:
            encoded = self.embedder.encode([self.canaries.canaries[i].text for i in missing])
            vectors.update(zip(missing, encoded, strict=True))
        return vectors

    def _enough(self, fact: int, hits: list[ValueHit]) -> bool:
        return 2 * len({h.slot for h in hits}) >= self._slot_count[fact] and any(h.strong for h in hits)

    def slot_hits(self, text: str, compacted: str) -> dict[int, list[ValueHit]]:
        """fact index -> its values found in the answer, for the facts that could still be there."""
        found: dict[int, list[ValueHit]] = {}
        for index, hits in self.values.hits(text, compacted).items():
            if not self._enough(index, hits):
                hits = hits + self._near(index, hits, compacted)
            if self._enough(index, hits):
                found[index] = hits
        return found

    def _near(self, fact: int, hits: list[ValueHit], compacted: str) -> list[ValueHit]:
        """The fact's missing long values written with an edit or two (a model retelling "Rynmar Bracklark" as
        "Ryncmar Bracklark"), near the values found: each one's best alignment in the stretch of the answer
        around them, at NEAR_SCORE or better."""
        canary = self.canaries.canaries[fact]
        reach = SPREAD * len(canary.text)
        low = max(0, min(h.start for h in hits) - reach)
        window = compacted[low : max(h.end for h in hits) + reach]
        # A value counts as there when found whole; a part of it (a family name) may still be the edited whole.
        present = {h.slot for h in hits if h.end - h.start >= len(compact(canary.values[h.slot]))}
        near = []
        for slot, value in enumerate(canary.values):
            target = compact(value)
            if slot in present or len(target) < NEAR_MIN:
                continue
            aligned = fuzz.partial_ratio_alignment(target, window, score_cutoff=NEAR_SCORE)
            if aligned is not None:
                near.append(ValueHit(slot, low + aligned.dest_start, low + aligned.dest_end, strong(value), near=True))
        return near

    def placed(self, text: str, candidates: dict[int, list[ValueHit]]) -> dict[int, list[ValueHit]]:
        """The candidates' values mapped to `text`, kept where they are whole words lying together and
        still enough to attribute the fact."""
        kept: dict[int, list[ValueHit]] = {}
        for fact, hits in candidates.items():
            mapped = [h._replace(start=s, end=e) for h in hits for s, e in [original_span(text, h.start, h.end)]]
            words = sorted((h for h in mapped if h.near or whole_word(text, h.start, h.end)), key=lambda h: h.start)
            reach = SPREAD * len(self.canaries.canaries[fact].text)
            best: list[ValueHit] = []
            for first, hit in enumerate(words):  # a few values per fact: quadratic is fine
                group = [h for h in words[first:] if h.end - hit.start <= reach]
                if self._enough(fact, group) and len({h.slot for h in group}) > len({h.slot for h in best}):
                    best = group
            if best:
                kept[fact] = best
        return kept

    def _candidates(self, text: str, compacted: str) -> dict[int, list[ValueHit]]:
        """The facts whose values lie together in the answer, enough of them to attribute the fact."""
        found = self.slot_hits(text, compacted)
        return self.placed(text, found) if found else {}

    def _chunks(self, text: str, candidates: dict[int, list[ValueHit]]) -> dict[int, list[tuple[int, int]]]:
        """Each candidate's chunks to embed: the sentence around its values, and a window of the fact's length."""
        return {index: _chunks_around(text, min(h.start for h in spans), max(h.end for h in spans),
                                      len(self.canaries.canaries[index].text.split()))
                for index, spans in candidates.items()}

    def detect(self, record: Record, compacted: str) -> list[Hit]:
        return self.detect_many([(record, compacted)])[0]

    def detect_many(self, answers: Sequence[tuple[Record, str]]) -> list[list[Hit]]:
        """The candidates of every answer first, then their chunks embedded together: one model call per tier
        for all the answers (USE encodes a sentence 1.4-1.6x cheaper in a batch of 8-64 than alone)."""
        candidates = [self._candidates(record.text, compacted) for record, compacted in answers]
        chunks = [self._chunks(record.text, found) for (record, _), found in zip(answers, candidates, strict=True)]
        # The sentences first, then a fact-sized window only for the facts their sentence did not confirm: most
        # retellings are confirmed by their sentence, and embedding is the detector's cost (compute-bound).
        best: list[dict[int, tuple[float, tuple[int, int]]]] = [{} for _ in answers]
        for tier in range(2):
            asked = [(n, index) for n, found in enumerate(candidates) for index in found
                     if len(chunks[n][index]) > tier and best[n].get(index, (-1.0,))[0] < self.threshold]
            if not asked:
                break
            spans = [chunks[n][index][tier] for n, index in asked]
            vectors = self.embedder.encode([answers[n][0].text[s:e] for (n, _), (s, e) in zip(asked, spans,
                                                                                               strict=True)])
            facts = np.stack([self._vectors[index] for _, index in asked])
            scores = np.einsum("ij,ij->i", vectors, facts)  # unit rows: each chunk's cosine with its own fact
            for (n, index), span, score in zip(asked, spans, scores.tolist(), strict=True):
                if score > best[n].get(index, (-1.0,))[0]:
                    best[n][index] = (score, span)
        return [[Hit(self.name, score, *span, canary=self.canaries.canaries[index],
                     evidence=(Retold(len({h.slot for h in found[index]}), self._slot_count[index]),))
                 for index, (score, span) in scored.items() if score >= self.threshold]
                for found, scored in zip(candidates, best, strict=True)]


def _chunks_around(text: str, start: int, end: int, words: int) -> list[tuple[int, int]]:
    """The sentence(s) spanning [start, end), and a window of about `words` words centred on them."""
    sentence = sentence_around(text, start, end)
    spaces = _space_runs(text)
    half = words // 2 + 2
    first, last = int(np.searchsorted(spaces, start)), int(np.searchsorted(spaces, end))
    before, after = spaces[max(0, first - half) : first], spaces[last : last + half]
    window = (int(before[0]) + 1 if len(before) else 0, int(after[-1]) if len(after) else len(text))
    return [sentence] if window == sentence else [sentence, window]


_SPACE_RUN = re.compile(r"\s+")


@lru_cache(maxsize=1)
def _plane_spaces() -> npt.NDArray[np.bool_]:
    """Whether each character of the Basic Multilingual Plane is whitespace, as `\\s` reads it (str.isspace)."""
    return np.array([chr(c).isspace() for c in range(0x10000)])


def _space_runs(text: str) -> npt.NDArray[np.int64]:
    """Where each run of whitespace in `text` starts, ascending: one table lookup of the code points (a regular
    expression's match objects, one per word, were a tenth of a Korean answer's semantic pass)."""
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    if not len(codes) or codes.max() >= 0x10000:
        return np.fromiter((m.start() for m in _SPACE_RUN.finditer(text)), dtype=np.int64)
    space = _plane_spaces()[codes]
    return np.flatnonzero(space & ~np.concatenate(([False], space[:-1])))
