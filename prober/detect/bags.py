"""Which fuzzy candidates could score at all, counted for a whole batch at once.

rapidfuzz's partial_ratio scores an alignment as 2 x (characters in common, in order) / (both lengths), so a
stretch of answer that shares fewer characters with a token body than the threshold asks (`least_shared`) --
counted as multisets, order aside -- cannot reach it.  A piece found by chance in compact English sits in a
stretch that shares far fewer of its body's characters than the 24 that 0.84 asks; a token with five characters
changed shares 27.  Counting is numpy over the batch; scoring one candidate is a rapidfuzz call and Python around
it, so only the candidates that could score are scored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from prober.canaries import tokens
from prober.detect.pieces import I64, code_table

_SYMBOLS = len(tokens.ALPHABET)
TOKEN_THRESHOLD = 0.84  # the fuzzy detector's score for a token body (fuzzy.py says why)
CHUNK = 8_192  # patterns counted at a time
_CODE = code_table(_SYMBOLS)  # outside the alphabet: a symbol of its own, which no body has


def least_shared(length: int, threshold: float) -> int:
    """The fewest characters an alignment scoring `threshold` has in common with a pattern of `length` (its own
    length is at least as many, and 2 x common / (length + its own) at least the threshold)."""
    return min(need for own in range(1, length + 1)
               if (need := math.ceil(threshold * (length + own) / 2 - 1e-9)) <= own)


SCORABLE = least_shared(tokens.BODY_LEN, TOKEN_THRESHOLD)  # 24 of a body's 32 characters


class TokenBags:
    """The characters of each pattern in the token alphabet, counted (a token body's are all of them); and each
    token body's bytes, to compare a group of it with an answer's."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self._bodies = np.zeros((len(patterns), tokens.BODY_LEN), dtype=np.uint8)
        for i, pattern in enumerate(patterns):
            if len(pattern) == tokens.BODY_LEN and pattern.isascii():
                self._bodies[i] = np.frombuffer(pattern.encode(), dtype=np.uint8)
        self._counts = np.zeros((len(patterns), _SYMBOLS), dtype=np.uint8)
        for first in range(0, len(patterns), CHUNK):  # bounded temporaries, whatever the number of patterns
            data = [pattern.encode() for pattern in patterns[first : first + CHUNK]]
            codes = np.frombuffer(b"".join(data).translate(_CODE), dtype=np.uint8)
            row = np.repeat(np.arange(len(data), dtype=np.int32), [len(d) for d in data])
            counts = np.bincount(row * (_SYMBOLS + 1) + codes, minlength=len(data) * (_SYMBOLS + 1))
            self._counts[first : first + len(data)] = np.minimum(
                counts.reshape(len(data), _SYMBOLS + 1)[:, :_SYMBOLS], 255)

    def same(self, joined: bytes, pattern: I64, offset: I64, at: I64, length: int) -> npt.NDArray[np.bool_]:
        """For each i: whether joined[at[i]:at[i] + length] is body pattern[i]'s characters from offset[i] on."""
        data = np.frombuffer(joined, dtype=np.uint8)
        span = np.arange(length)
        inside = (at >= 0) & (at + length <= len(data))
        where = np.where(inside, at, 0)[:, None] + span
        return inside & (data[where] == self._bodies[pattern[:, None], offset[:, None] + span]).all(axis=1)  # type: ignore[no-any-return]

    def shared(self, joined: bytes, pattern: I64, begin: I64, end: I64) -> I64:
        """For each i: how many characters pattern[i] has in common with joined[begin[i]:end[i]], counted as
        multisets (a bound on any alignment's)."""
        codes = np.frombuffer(joined.translate(_CODE), dtype=np.uint8)
        length = np.maximum(end - begin, 0)
        row = np.repeat(np.arange(len(length)), length)
        position = np.arange(len(row)) - np.repeat(np.cumsum(length) - length, length) + np.repeat(begin, length)
        counts = np.bincount(row * (_SYMBOLS + 1) + codes[position], minlength=len(length) * (_SYMBOLS + 1))
        window = counts.reshape(len(length), _SYMBOLS + 1)[:, :_SYMBOLS]
        return np.minimum(window, self._counts[pattern]).sum(axis=1, dtype=np.int64)  # type: ignore[no-any-return]
