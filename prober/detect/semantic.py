"""Semantic detection: a canary fact that a model reworded.

Cosine similarity alone cannot tell two tenants' facts from one template apart (measured up to 0.68
with MiniLM), so attribution rests on the distinctive slot values, and the embedding confirms that
the sentence around them still says the fact:

1. an Aho-Corasick pass over the compact answer finds the facts whose slot values (or the parts of
   multi-word values, or their other spellings: a Korean name romanized in an English answer) appear --
   most answers stop here, with no embedding at all;
2. for each candidate, chunks around the slot hits are embedded: the sentence that holds them and a
   window of about the fact's length, so a fact run into a long sentence is not diluted;
3. a blocked matrix product of chunk and fact embeddings (on the embedder's device) gives the best
   cosine per candidate; a hit needs it above the threshold *and* half of the slot values present.
"""

from __future__ import annotations

import re

import ahocorasick
import numpy as np

from prober.canaries.compact import compact, original_span
from prober.detect.base import CanarySet, Detector, Hit
from prober.embeddings import Embedder, Vectors
from prober.types import Record, Severity

MIN_PART = 5  # compact length of a slot-value part that may count on its own
BLOCK_ROWS = 8192


def blocked_cosine(chunks: Vectors, facts: Vectors, device: str) -> Vectors:
    """facts x chunks cosine matrix (rows are unit vectors), BLOCK_ROWS facts at a time on `device`: numpy on
    the CPU, torch in fp16 on a GPU (unit vectors keep cosines to about 1e-3 there; thresholds are 0.4+)."""
    if device == "cpu":
        product: Vectors = np.ascontiguousarray(facts) @ np.ascontiguousarray(chunks).T
        return product
    import torch  # imported here: nothing pays torch's start-up unless it compares on a GPU

    right = torch.from_numpy(np.ascontiguousarray(chunks)).to(device, torch.float16).T
    blocks = [(torch.from_numpy(np.ascontiguousarray(facts[i : i + BLOCK_ROWS])).to(device, torch.float16)
               @ right).float().cpu() for i in range(0, len(facts), BLOCK_ROWS)]
    gpu: Vectors = torch.cat(blocks).numpy()
    return gpu


class SemanticDetector(Detector):
    """A canary fact paraphrased: slot values agree and the sentence means the same."""

    name = "semantic"
    rank = 2
    severity = Severity.HIGH

    def __init__(self, canaries: CanarySet, embedder: Embedder) -> None:
        self.canaries = canaries
        self.embedder = embedder
        self.threshold = embedder.threshold
        embedder.load()
        self._facts = canaries.facts()
        self._slot_count: dict[int, int] = {}
        self._automaton = ahocorasick.Automaton()
        for index in self._facts:
            canary = canaries.canaries[index]
            self._slot_count[index] = len(canary.slots)
            # A value and its other spellings (a Korean name romanized in an English answer) count alike.
            for slot_no, value in [*enumerate(canary.slots), *canary.aliases]:
                parts = {compact(value)} | {compact(p) for p in value.split() if len(compact(p)) >= MIN_PART}
                for part in filter(None, parts):
                    length, entries = self._automaton.get(part, (len(part), ()))
                    self._automaton.add_word(part, (length, (*entries, (index, slot_no))))
        if len(self._automaton):
            self._automaton.make_automaton()
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

    def slot_hits(self, compacted: str) -> dict[int, list[tuple[int, int, int]]]:
        """fact index -> [(slot number, compact start, compact end)], for facts with half their slots."""
        found: dict[int, list[tuple[int, int, int]]] = {}
        if not len(self._automaton):
            return found
        for end, (length, entries) in self._automaton.iter(compacted):
            for index, slot_no in entries:
                found.setdefault(index, []).append((slot_no, end + 1 - length, end + 1))
        return {i: spans for i, spans in found.items()
                if 2 * len({s for s, _, _ in spans}) >= self._slot_count[i]}

    def detect(self, record: Record, compacted: str) -> list[Hit]:
        candidates = self.slot_hits(compacted)
        if not candidates:
            return []
        texts: list[str] = []
        spans: list[tuple[int, int]] = []
        rows: dict[int, list[int]] = {}
        for index, slot_spans in candidates.items():
            start, end = original_span(record.text, min(s for _, s, _ in slot_spans),
                                       max(e for _, _, e in slot_spans))
            words = len(self.canaries.canaries[index].text.split())
            for span in _chunks_around(record.text, start, end, words):
                rows.setdefault(index, []).append(len(texts))
                texts.append(record.text[span[0] : span[1]])
                spans.append(span)
        vectors = self.embedder.encode(texts)
        facts = np.stack([self._vectors[i] for i in candidates])
        # best[i, j]: cosine of candidate i against chunk j, blocked over candidates.
        scores = blocked_cosine(vectors, facts, self.embedder.matmul_device())
        hits = []
        for row, (index, slot_spans) in enumerate(candidates.items()):
            own = rows[index]
            best = own[int(np.argmax(scores[row, own]))]
            score = float(scores[row, best])
            if score >= self.threshold:
                hits.append(Hit(self.name, score, *spans[best], canary=self.canaries.canaries[index],
                                details={"slots_present": len({s for s, _, _ in slot_spans}),
                                         "slots_total": self._slot_count[index]}))
        return hits


_TERMINATORS = ".!?。\n"


def _chunks_around(text: str, start: int, end: int, words: int) -> list[tuple[int, int]]:
    """The sentence(s) spanning [start, end), and a window of about `words` words centred on them."""
    sentence_start = max(text.rfind(t, 0, start) for t in _TERMINATORS) + 1
    ends = [i for i in (text.find(t, end) for t in _TERMINATORS) if i >= 0]
    sentence = (sentence_start, min(ends) + 1 if ends else len(text))
    spaces = [m.start() for m in re.finditer(r"\s+", text)]
    half = words // 2 + 2
    before = [p for p in spaces if p < start][-half:]
    after = [p for p in spaces if p >= end][:half]
    window = (before[0] + 1 if before else 0, after[-1] if after else len(text))
    return [sentence] if window == sentence else [sentence, window]
