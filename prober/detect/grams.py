"""An inverted index of character q-grams that stays small at 100,000+ canaries.

Each q-gram of a compact text is a 64-bit polynomial hash of its code points, computed for the whole text at
once with numpy.  The index is three flat arrays (sorted gram keys, where each key's postings start, how many
there are) and one array of canary numbers: about 16 bytes per posting, where a dict of str -> array cost
about 120 (336 MiB at 100,000 tokens, now 36 MiB).  A hash collision can only add a candidate, which its
score then rejects; it never hides one.  Arrays pickle cheaply, so a scanner crosses process boundaries.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Keys = npt.NDArray[np.uint64]
Ids = npt.NDArray[np.int32]
Positions = npt.NDArray[np.int64]
_PRIME = 1_099_511_628_211  # FNV's 64-bit prime: odd, so it has an inverse modulo 2**64
_NO_KEYS: Keys = np.zeros(0, dtype=np.uint64)
_MIX = np.uint64(0xBF58476D1CE4E5B9)


class _Powers:
    """P**n and P**-n modulo 2**64 for n < len, grown on demand (numpy's uint64 arithmetic wraps)."""

    def __init__(self) -> None:
        self.up: Keys = np.ones(1, dtype=np.uint64)
        self.down: Keys = np.ones(1, dtype=np.uint64)

    def need(self, length: int) -> None:
        if length <= len(self.up):
            return
        size = max(length, 2 * len(self.up))
        self.up = np.ones(size, dtype=np.uint64)
        self.up[1:] = np.cumprod(np.full(size - 1, _PRIME, dtype=np.uint64))
        self.down = np.ones(size, dtype=np.uint64)
        self.down[1:] = np.cumprod(np.full(size - 1, pow(_PRIME, -1, 2**64), dtype=np.uint64))


_POWERS = _Powers()


def gram_keys(text: str, q: int) -> Keys:
    """A 64-bit hash of every q-gram of `text`, in order, in a few vector operations whatever q is: the
    polynomial sum(c[i+k] * P**(q-1-k)) from prefix sums of c[j] * P**-j, differenced and scaled back."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
    count = len(codes) - q + 1
    if count <= 0:
        return _NO_KEYS
    _POWERS.need(len(codes) + 1)
    sums = np.zeros(len(codes) + 1, dtype=np.uint64)
    np.cumsum(codes * _POWERS.down[: len(codes)], out=sums[1:])
    keys: Keys = (sums[q:] - sums[:count]) * _POWERS.up[q - 1 : q - 1 + count]
    # The polynomial leaves its top bits clustered (neighbouring grams differ in low-order terms); a
    # splitmix64-style finaliser spreads them, since KeyTable buckets keys by their top bits.
    keys ^= keys >> np.uint64(31)
    keys *= _MIX
    keys ^= keys >> np.uint64(29)
    return keys


class KeyTable:
    """Sorted 64-bit keys found through a directory on their top bits: a lookup reads one or two places, where
    a binary search over a million keys reads twenty (it was 40% of a log scan's time)."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys  # sorted; equal keys are neighbours
        bits = len(keys).bit_length() + 1  # about two buckets per key
        self._shift = np.uint64(64 - bits)
        self._offsets = np.searchsorted(keys >> self._shift, np.arange(2**bits + 1, dtype=np.uint64)).astype(np.int32)

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, queries: Keys) -> tuple[Positions, Positions]:
        """(query numbers, key numbers) of every pair of an equal query and key."""
        buckets = queries >> self._shift
        asked = np.flatnonzero(self._offsets[buckets + np.uint64(1)] > self._offsets[buckets])
        at = self._offsets[buckets[asked]].astype(np.int64)
        end = self._offsets[buckets[asked] + np.uint64(1)]
        found_query, found_key = [], []
        while len(asked):  # one pass per key in the fullest bucket asked about (a handful)
            equal = self.keys[at] == queries[asked]
            found_query.append(asked[equal])
            found_key.append(at[equal])
            at += 1
            more = at < end
            asked, at, end = asked[more], at[more], end[more]
        if not found_query:
            return _NO_POSITIONS, _NO_POSITIONS
        return np.concatenate(found_query), np.concatenate(found_key)


_NO_POSITIONS: Positions = np.zeros(0, dtype=np.int64)
_NO_IDS: Ids = np.zeros(0, dtype=np.int32)


class GramIndex:
    """Which patterns share q-grams with a text, and how many each; grams in too many patterns are left out."""

    def __init__(self, patterns: Sequence[str], q: int, max_postings: int) -> None:
        self.q = q
        per_pattern = [np.unique(gram_keys(p, q)) for p in patterns]
        keys = np.concatenate(per_pattern) if per_pattern else _NO_KEYS
        owners = np.repeat(np.arange(len(patterns), dtype=np.int32), [len(k) for k in per_pattern])
        order = np.argsort(keys, kind="stable")
        keys, owners = keys[order], owners[order]
        unique, counts = np.unique(keys, return_counts=True)
        kept = counts <= max_postings
        self._owners: Ids = owners[np.repeat(kept, counts)]
        self._table = KeyTable(unique[kept])
        self._counts = counts[kept].astype(np.int32)
        self._starts = (np.cumsum(self._counts) - self._counts).astype(np.int64)
        # How many of each pattern's grams made it into the index.
        self.indexed: Ids = np.bincount(self._owners, minlength=len(patterns)).astype(np.int32)

    def shared(self, text: str) -> tuple[Ids, Ids]:
        """(pattern numbers, grams each shares with `text`), for patterns sharing at least one."""
        if not len(self._table):
            return _NO_IDS, _NO_IDS
        _, where = self._table.find(gram_keys(text, self.q))
        where = np.unique(where)  # a gram repeated in the text counts once
        counts = self._counts[where]
        if not len(counts):
            return _NO_IDS, _NO_IDS
        # Positions of every posting of every matched gram: each run starts at its key's start.
        runs = np.cumsum(counts) - counts
        positions = np.repeat(self._starts[where] - runs, counts) + np.arange(int(counts.sum()))
        ids, shared = np.unique(self._owners[positions], return_counts=True)
        return ids.astype(np.int32), shared.astype(np.int32)
