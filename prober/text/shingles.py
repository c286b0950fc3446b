"""What a sent prompt leaves in the ledger: keyed hashes of its word shingles, never its text.

A real model attending over another tenant's stale pages copies runs of that prompt verbatim (6 to 12+
words of filler).  To attribute such a run, the ledger keeps, for every prompt the prober sends, the set of
64-bit hashes of its runs of SHINGLE consecutive words.  Each word is first hashed under the deployment key
(BLAKE2b, keyed), so the record says nothing about the text to anyone without the key: no dictionary of
words can be tried against it.  Words are lower-cased runs of letters and digits in any script.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

SHINGLE = 8  # words in a shingle
_WORD = re.compile(r"\w+")
_PRIME = np.uint64(1_099_511_628_211)
_WORD_CACHE = 65_536  # distinct words whose hashes are kept (a prompt or answer has a few hundred)

Hashes = npt.NDArray[np.uint64]


@dataclass(frozen=True)
class PromptShingles:
    """One sent prompt's shingle hashes, sorted and unique, with whose it was and how long it is kept."""

    tenant: str
    probe_id: str
    created_at: float
    expires_at: float
    hashes: bytes  # little-endian uint64, sorted

    def array(self) -> Hashes:
        return np.frombuffer(self.hashes, dtype="<u8").astype(np.uint64)


class Shingler:
    """Shingle hashes of texts under one deployment key."""

    def __init__(self, key: bytes) -> None:
        self._key = hashlib.sha256(b"leakprobe-shingles\x00" + key).digest()[:32]
        self._words: dict[str, int] = {}

    def _word(self, word: str) -> int:
        cached = self._words.get(word)
        if cached is None:
            if len(self._words) >= _WORD_CACHE:
                self._words.clear()
            cached = int.from_bytes(hashlib.blake2b(word.encode(), key=self._key, digest_size=8).digest(), "little")
            self._words[word] = cached
        return cached

    def _codes(self, words: list[str]) -> Hashes:
        """Each word's keyed hash: hashed once per distinct word, then looked up in C."""
        table = {word: self._word(word) for word in dict.fromkeys(words)}
        return np.fromiter(map(table.__getitem__, words), dtype=np.uint64, count=len(words))

    def hashes(self, text: str) -> Hashes:
        """The hash of every shingle of `text`, in order (a prompt of a million tokens in about a second)."""
        found = _WORD.findall(text)
        # Lower-casing the joined words is lower-casing each one (no word holds the separator, and Greek
        # final sigma still ends its word there), in one call instead of one per word.
        return _rolled(self._codes("\x00".join(found).lower().split("\x00") if found else []))

    def spans(self, text: str) -> tuple[Hashes, list[tuple[int, int]]]:
        """The hash of every shingle of `text`, in order, and the span of its words in the text."""
        words = list(_WORD.finditer(text))
        # One pass, no list of words beside the matches: an answer may be tens of megabytes (the scan's memory
        # bound is tested on one of 30 MiB).
        codes = np.fromiter((self._word(w.group(0).lower()) for w in words), dtype=np.uint64, count=len(words))
        hashes = _rolled(codes)
        return hashes, [(words[i].start(), words[i + SHINGLE - 1].end()) for i in range(len(hashes))]

    def record(self, text: str, tenant: str, probe_id: str, created_at: float, expires_at: float) -> PromptShingles:
        hashes = self.hashes(text)
        return PromptShingles(tenant, probe_id, created_at, expires_at, distinct(hashes).astype("<u8").tobytes())


def distinct(hashes: Hashes) -> Hashes:
    """Sorted unique hashes.  A sort and a mask: numpy 2.4's np.unique hashes instead and took 1.2 s where this
    takes 0.02 s (750,000 hashes, nearly all distinct)."""
    ordered = np.sort(hashes)
    keep = np.ones(len(ordered), dtype=bool)
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def _rolled(codes: Hashes) -> Hashes:
    """Shingle hashes from word hashes: a polynomial over each run of SHINGLE words, modulo 2**64."""
    count = len(codes) - SHINGLE + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    hashes = np.zeros(count, dtype=np.uint64)
    with np.errstate(over="ignore"):  # arithmetic modulo 2**64 is the point
        for offset in range(SHINGLE):
            hashes = hashes * _PRIME + codes[offset : offset + count]
    return hashes
