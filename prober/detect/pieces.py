"""Where pieces of token bodies lie in a batch of compact answers, found with numpy over the whole batch.

A piece is 5 or 6 characters of the 32-character token alphabet, so it is a 25- or 30-bit number, and so is every
window of an answer that could hold one: the batch's 5-character windows are numbered at once, kept where a table
of the pieces (a byte per 25-bit number, 32 MiB, at 100,000 canaries; smaller for fewer) says a piece may be or
start there, and those few looked up in the sorted pieces. Compact English is written almost wholly in the token
alphabet (compaction folds O, I, L and U into it), so an automaton of 600,000 short pieces read it slowly (~40 ns a
character, a dense trie); this reads a batch at ~15 ns a character, most of it numbering the windows. A piece
outside the alphabet (no token minted here has one) is the caller's to search otherwise (`outside`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from prober.canaries import tokens

BITS = 5  # a character of the token alphabet
LENGTHS = (5, 6)  # of the pieces (patterns.CUTS)
I64 = npt.NDArray[np.int64]
U32 = npt.NDArray[np.uint32]


def code_table(outside: int) -> bytes:
    """bytes.translate's table of each byte's number in the token alphabet, `outside` where it is not in it."""
    return bytes(tokens.ALPHABET.index(chr(b)) if chr(b) in tokens.ALPHABET else outside for b in range(256))


_CODE = code_table(len(tokens.ALPHABET) - 1)  # a window outside the alphabet is refused by its gap
_GAP = bytes(chr(b) not in tokens.ALPHABET for b in range(256))


class Batch(NamedTuple):
    """Answers as UTF-8, and joined: a newline between two answers, where each starts."""

    data: list[bytes]
    joined: bytes
    starts: I64

    @classmethod
    def of(cls, texts: Sequence[str]) -> Batch:
        data = [text.encode() for text in texts]
        return cls(data, b"\n".join(data), np.cumsum([0, *(len(d) + 1 for d in data)], dtype=np.int64)[:-1])


class Found(NamedTuple):
    """Pieces found in a batch, ordered by answer and start: piece `pattern[i]` (its number among the distinct
    pieces) at [start[i], end[i]) bytes of answer `answer[i]`."""

    answer: I64
    pattern: I64
    start: I64
    end: I64


class PieceTable:
    """Distinct pieces, numbered in the order given; those not of the token alphabet, 5 or 6 long, it cannot
    hold are `outside`."""

    def __init__(self, pieces: Sequence[str]) -> None:
        # A byte per 5-character number (its low bits, where there are few pieces): bit 0 where a 5-character
        # piece may be that number, bit 1 where a 6-character piece may start with it.  One read of it per window
        # of the batch is the whole search; the few windows it keeps are looked up in the sorted pieces.  Sized to
        # 64 entries a piece: a table larger than the pieces need would cost its pages (huge pages, touched all
        # over by a few hundred pieces) in every scanner.
        self._mask = (1 << min(BITS * 5, max(12, (64 * len(pieces)).bit_length()))) - 1
        self._starts = np.zeros(self._mask + 1, dtype=np.uint8)
        self._sorted: list[tuple[U32, I64]] = []
        self.outside: list[int] = []
        for flag, length in enumerate(LENGTHS):
            ids = np.asarray([i for i, p in enumerate(pieces) if len(p) == length and p.isascii()], dtype=np.int64)
            joined = "".join(pieces[i] for i in ids.tolist()).encode()
            gaps = np.frombuffer(joined.translate(_GAP), dtype=np.bool_).reshape(-1, length).any(axis=1)
            self.outside += ids[gaps].tolist()
            ids = ids[~gaps]
            codes = np.frombuffer(joined.translate(_CODE), dtype=np.uint8).reshape(-1, length)[~gaps]
            values = np.zeros(len(ids), dtype=np.uint32)
            for k in range(length):
                values = (values << np.uint32(BITS)) | codes[:, k]
            self._starts[(values >> np.uint32(BITS * (length - 5))) & np.uint32(self._mask)] |= np.uint8(1 << flag)
            order = np.argsort(values, kind="stable")
            self._sorted.append((values[order], ids[order]))
        self.outside += [i for i, p in enumerate(pieces) if len(p) not in LENGTHS or not p.isascii()]

    def __getstate__(self) -> dict[str, object]:
        """Pickled with the table's few set bytes where they are, not the whole table (32 MiB at most)."""
        where = np.flatnonzero(self._starts).astype(np.uint32)
        return {**self.__dict__, "_starts": (where, self._starts[where])}

    def __setstate__(self, state: dict[str, Any]) -> None:
        where, flags = state["_starts"]
        starts = np.zeros(state["_mask"] + 1, dtype=np.uint8)
        starts[where] = flags
        self.__dict__.update(state, _starts=starts)

    def find(self, batch: Batch) -> Found:
        """Every piece in each answer (the newline between two is a gap: no piece spans them)."""
        joined, starts = batch.joined, batch.starts
        codes = np.frombuffer(joined.translate(_CODE), dtype=np.uint8)
        if len(codes) < LENGTHS[0]:
            return Found(*(np.zeros(0, dtype=np.int64) for _ in range(4)))
        fives = np.zeros(len(codes) - 4, dtype=np.uint32)
        for k in range(5):
            fives <<= np.uint32(BITS)
            fives |= codes[k : len(codes) - 4 + k]
        keys = fives & np.uint32(self._mask) if self._mask < (1 << (BITS * 5)) - 1 else fives
        maybe = np.flatnonzero(self._starts[keys])
        flags = self._starts[keys[maybe]]
        gaps = np.frombuffer(joined.translate(_GAP), dtype=np.bool_)
        at_all, patterns_all, lengths_all = [], [], []
        for flag, (length, (values, ids)) in enumerate(zip(LENGTHS, self._sorted, strict=True)):
            at = maybe[(flags & np.uint8(1 << flag)) != 0]
            at = at[at + length <= len(codes)]
            numbers = fives[at]
            for k in range(5, length):
                numbers = (numbers << np.uint32(BITS)) | codes[at + k]
            slots = np.minimum(np.searchsorted(values, numbers), len(values) - 1)
            # A piece: the number is one, and no gap (outside the alphabet, between answers) is in the window.
            hit = (values[slots] == numbers) & ~gaps[at[:, None] + np.arange(length)].any(axis=1)
            at_all.append(at[hit])
            patterns_all.append(ids[slots[hit]])
            lengths_all.append(np.full(int(hit.sum()), length, dtype=np.int64))
        at, patterns, lengths = (np.concatenate(a) for a in (at_all, patterns_all, lengths_all))
        order = np.argsort(at, kind="stable")
        at, patterns, lengths = at[order], patterns[order], lengths[order]
        answers = np.searchsorted(starts, at, side="right") - 1
        offsets = at - starts[answers]
        return Found(answers, patterns, offsets, offsets + lengths)

