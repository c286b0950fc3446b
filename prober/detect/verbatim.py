"""Verbatim runs of another tenant's prompt: the filler a real model copies out of stale pages word for word.

The ledger keeps keyed hashes of the word shingles of every prompt the prober sent (prober/shingles.py), never
the text.  An answer's shingles are looked up in them; a run of consecutive shingles that only one tenant's
prompts hold, that the answer's own prompt does not hold, and that is not the observer's own, is that tenant's
prompt copied.  Filler is made of common words, so a shingle that the prompts of two tenants share (template
sentences, recurring filler) says nothing, and a run must be long (MIN_RUN_WORDS): a single filler sentence
recurs in one prompt in a few thousand.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from prober.detect.base import Detector, Hit
from prober.detect.grams import KeyTable
from prober.shingles import SHINGLE, Hashes, PromptShingles, Shingler
from prober.types import Record, Severity

MIN_RUN_WORDS = 12  # words in a run that attributes (SHINGLE + 4: five shingles in a row)


class VerbatimDetector(Detector):
    """A run of words of another tenant's sent prompt, copied verbatim."""

    name = "verbatim"
    rank = 4
    severity = Severity.HIGH

    def __init__(self, prompts: Sequence[PromptShingles], key: bytes) -> None:
        self.shingler = Shingler(key)
        arrays = [p.array() for p in prompts]
        hashes = np.concatenate([np.zeros(0, dtype=np.uint64), *arrays])
        owners = np.repeat(np.arange(len(prompts), dtype=np.int32), [len(a) for a in arrays])
        tenant_of = {t: i for i, t in enumerate(sorted({p.tenant for p in prompts}))}
        tenants = np.asarray([tenant_of[p.tenant] for p in prompts], dtype=np.int32)[owners]
        order = np.lexsort((tenants, hashes))
        hashes, owners, tenants = hashes[order], owners[order], tenants[order]
        first = np.ones(len(hashes), dtype=bool)
        first[1:] = hashes[1:] != hashes[:-1]
        # A shingle whose first and last holder (sorted by tenant) differ is shared: it attributes nothing.
        starts = np.flatnonzero(first)
        ends = np.append(starts[1:], len(hashes)) - 1
        alone = tenants[starts] == tenants[ends]
        self._table = KeyTable(hashes[starts[alone]])
        self._owner = owners[starts[alone]]  # the first prompt (in ledger order) that holds it
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
        own = self._prompt_hashes(record.prompt)
        owner_at = np.full(len(hashes), -1, dtype=np.int64)
        owner_at[at] = self._owner[found]
        if len(own):
            owner_at[np.isin(hashes, own)] = -1  # the answer's own prompt holds it: the model read it there
        hits: list[Hit] = []
        runs: list[tuple[int, int]] = []  # [first, last] shingles of runs held by one tenant
        for index in np.flatnonzero(owner_at >= 0).tolist():
            tenant = self._prompts[int(owner_at[index])].tenant
            if runs and runs[-1][1] == index - 1 and self._prompts[int(owner_at[runs[-1][0]])].tenant == tenant:
                runs[-1] = (runs[-1][0], index)
            else:
                runs.append((index, index))
        for first, last in runs:
            words = last - first + SHINGLE
            prompt = self._prompts[int(owner_at[first])]
            if words < MIN_RUN_WORDS or prompt.tenant == record.tenant:
                continue  # too short to be anyone's, or the observer's own earlier prompt
            hits.append(Hit(self.name, min(1.0, words / (2 * MIN_RUN_WORDS)), spans[first][0], spans[last][1],
                            tenant=prompt.tenant, details={"fragment": "prompt_run", "words": words,
                                                           "probe_id": prompt.probe_id}))
        return hits

    def _prompt_hashes(self, prompt: str | None) -> Hashes:
        """The answer's own prompt's shingles, computed once per prompt."""
        if prompt is None:
            return np.zeros(0, dtype=np.uint64)
        with self._lock:
            if self._prompt[0] is not prompt:
                self._prompt = (prompt, np.unique(self.shingler.spans(prompt)[0]))
            return self._prompt[1]
