"""Verbatim runs of another tenant's prompt: the filler a real model copies out of stale pages word for word.

The ledger keeps keyed hashes of the word shingles of every prompt the prober sent (prober/text/shingles.py), never
the text.  An answer's shingles are looked up in them; a run of consecutive shingles that only one tenant's
prompts hold, that the answer's own prompt does not hold, and that is not the observer's own, is that tenant's
prompt copied.  Filler is made of common words, so a run that the prompts of two tenants both hold (template
sentences, recurring filler) says nothing, and a run must be long (MIN_RUN_WORDS).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from prober.detect.base import Detector, Hit
from prober.detect.grams import KeyTable
from prober.domain.evidence import PromptRun
from prober.domain.types import DetectorName, Record, Severity
from prober.text.shingles import SHINGLE, Hashes, PromptShingles, Shingler, distinct

# Words in a run that attributes: more than the longest filler sentence (15 words), so a run spans two of them
# or a filler sentence and a canary sentence (bench/detect.py: answers made of filler, against 1,000 recorded
# prompts, drew findings in 6 of 180 at 12 words, none at 16; every planted 20-word run was found).
MIN_RUN_WORDS = 16


class VerbatimDetector(Detector):
    """A run of words of another tenant's sent prompt, copied verbatim."""

    name = DetectorName.VERBATIM
    rank = 4
    severity = Severity.HIGH

    def __init__(self, prompts: Sequence[PromptShingles], key: bytes) -> None:
        self.shingler = Shingler(key)
        arrays = [p.array() for p in prompts]
        hashes = np.concatenate([np.zeros(0, dtype=np.uint64), *arrays])
        holders = np.repeat(np.arange(len(prompts), dtype=np.int32), [len(a) for a in arrays])
        order = np.argsort(hashes, kind="stable")
        hashes, self._holders = hashes[order], holders[order]
        first = np.ones(len(hashes), dtype=bool)
        first[1:] = hashes[1:] != hashes[:-1]
        self._starts = np.flatnonzero(first)  # each distinct shingle's holders: _holders[start : next start]
        self._ends = np.append(self._starts[1:], len(hashes))
        self._table = KeyTable(hashes[self._starts])
        self._prompts = list(prompts)
        self._lock = threading.Lock()
        self._prompt: tuple[str | None, Hashes] = (None, np.zeros(0, dtype=np.uint64))

    def detect(self, record: Record, compacted: str) -> list[Hit]:
        if not len(self._table):
            return []
        hashes, spans = self.shingler.spans(record.text)
        at, found = self._table.find(hashes)
        if not len(at):
            return []
        read = np.isin(hashes, self._prompt_hashes(record.prompt))  # the answer's own prompt holds it: read there
        held: dict[int, set[str]] = {}  # shingle position in the answer -> tenants whose prompts hold it
        for position, key in zip(at.tolist(), found.tolist(), strict=True):
            if not read[position]:
                held[position] = {self._prompts[h].tenant for h in self._holders[self._starts[key] : self._ends[key]]}
        hits: list[Hit] = []
        for first, last, tenant in _runs(held):
            # A degenerate answer ("the the the ...") repeats one shingle that some prompt happens to hold (a word
            # repeated to pad it): a run is as long as the distinct shingles it copies, as copied prose is.
            run = hashes[first : last + 1]
            words = len(distinct(run)) + SHINGLE - 1
            if words < MIN_RUN_WORDS or tenant == record.tenant:
                continue  # too short to be anyone's, or the observer's own earlier prompt
            probe = self._probe_of(run, tenant)
            hits.append(Hit(self.name, min(1.0, words / (2 * MIN_RUN_WORDS)), spans[first][0], spans[last][1],
                            tenant=tenant, probe_id=probe, evidence=(PromptRun(words),)))
        return hits

    def _probe_of(self, run: Hashes, tenant: str) -> str:
        """The tenant's prompt that holds most of the run."""
        _, found = self._table.find(run)
        counts: dict[int, int] = {}
        for key in found.tolist():
            for holder in self._holders[self._starts[key] : self._ends[key]].tolist():
                if self._prompts[holder].tenant == tenant:
                    counts[holder] = counts.get(holder, 0) + 1
        return self._prompts[max(counts, key=counts.__getitem__)].probe_id

    def _prompt_hashes(self, prompt: str | None) -> Hashes:
        """The answer's own prompt's shingles, computed once per prompt."""
        if prompt is None:
            return np.zeros(0, dtype=np.uint64)
        with self._lock:
            if self._prompt[0] is not prompt:
                self._prompt = (prompt, distinct(self.shingler.hashes(prompt)))
            return self._prompt[1]


def _runs(held: dict[int, set[str]]) -> list[tuple[int, int, str]]:
    """(first, last shingle, tenant) of each longest run of consecutive shingles that one tenant's prompts hold
    every one of and no other tenant's prompts hold all of: a run that two tenants' prompts both contain (their
    shared filler, a template sentence) attributes to neither."""
    out: list[tuple[int, int, str]] = []
    for tenant in sorted({t for tenants in held.values() for t in tenants}):
        positions = sorted(p for p, tenants in held.items() if tenant in tenants)
        first = previous = positions[0]
        for position in [*positions[1:], -1]:
            if position == previous + 1:
                previous = position
                continue
            common = set.intersection(*(held[p] for p in range(first, previous + 1)))
            if common == {tenant}:
                out.append((first, previous, tenant))
            first = previous = position
    return out
