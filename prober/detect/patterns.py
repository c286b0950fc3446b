"""Where the canaries' patterns lie in a compact answer, searched once for a batch of answers whatever the number
of canaries.

* **Pieces of token bodies**, for every token detector.  Each 32-character body is cut into six pieces (`CUTS`): a
  body with up to five characters substituted keeps at least one piece intact (pigeonhole), so a fuzzy candidate
  is a body with a piece in the answer, scored around that place.  Each 8-character group of a body holds one
  piece whole, so a group copied alone (a probe's tag, part of a body) is found through that piece, then
  confirmed on the text; a whole body, through its first piece, compared whole.  Short pieces would make a dense
  trie, slow on compact English (~40 ns a character), so they are numbers in a table read a batch of answers at a
  time (pieces.py), once per batch between the detectors (`PieceReader`).
* **Other patterns** (a fact's compact text) as they are, in an Aho-Corasick automaton (Rust, `ahocorasick_rs`).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, pairwise
from typing import Any, NamedTuple

import ahocorasick_rs
import numpy as np
import numpy.typing as npt

from prober.canaries import tokens
from prober.detect.bags import SCORABLE, TokenBags
from prober.detect.base import BATCH, CanarySet, Detector, Hit, Recent
from prober.detect.pieces import Batch, PieceTable
from prober.domain.types import CanaryKind, Record

CUTS = (0, 5, 11, 16, 21, 27, 32)  # piece k of a body is body[CUTS[k]:CUTS[k + 1]]
GROUP = 8  # characters in a group of a token body
GROUP_OF_PIECE = {0: 0, 2: 1, 3: 2, 5: 3}  # the group that holds each piece whole (pieces 1 and 4 straddle two)
CONTIGUOUS = ahocorasick_rs.Implementation.ContiguousNFA
REACH = 8  # characters a model may add to a body, on each side of where its piece says the body is


class Match(NamedTuple):
    """Canary `canary`'s pattern (or its piece `part`) at [start, end) of the compact answer.  A piece says how
    many characters its body has in common with the stretch around where it puts the body (`around`), counted
    as multisets: no alignment there shares more (a body's length where not counted)."""

    canary: int
    part: int
    start: int
    end: int
    shared: int = tokens.BODY_LEN

    @property
    def body_start(self) -> int:
        """Where the token body would start, for a piece of it."""
        return self.start - CUTS[self.part]

    def around(self, length: int) -> tuple[int, int]:
        """The stretch a body may take in an answer of `length`, edited, for a piece of it."""
        start = self.start - CUTS[self.part]
        return max(0, start - REACH), min(length, start + tokens.BODY_LEN + REACH)


class Whole(NamedTuple):
    """What `PatternIndex.whole_in` found in one answer."""

    matches: list[Match]
    after_prefixes: list[int]  # where the tokens' prefix ends: a body may start there


class _Owners:
    """Which (canary, part) each distinct pattern stands for (a probe's tag is in all of its tokens, a fact's text
    may be two tenants').  Flat arrays, not a list per pattern: a million small lists cost ~150 MB, and a forked
    scan worker's garbage collector would touch (copy) every one of them."""

    def __init__(self, owners: dict[str, list[tuple[int, int]]]) -> None:
        self.first = array("i", accumulate((len(o) for o in owners.values()), initial=0))
        self.canary = array("i", (canary for o in owners.values() for canary, _ in o))
        self.part = array("b", (part for o in owners.values() for _, part in o))

    @classmethod
    def of(cls, entries: Iterable[tuple[str, int, int]]) -> tuple[list[str], _Owners]:
        """The distinct patterns, numbered in order, and their owners (the patterns are the caller's to drop)."""
        owners: dict[str, list[tuple[int, int]]] = {}
        for pattern, canary, part in entries:
            owners.setdefault(pattern, []).append((canary, part))
        return list(owners), cls(owners)

    def entries(self, pattern: int, text: str) -> Iterator[tuple[str, int, int]]:
        for i in range(self.first[pattern], self.first[pattern + 1]):
            yield text, self.canary[i], self.part[i]

    def matches(self, pattern: int, start: int, end: int) -> Iterator[Match]:
        for i in range(self.first[pattern], self.first[pattern + 1]):
            yield Match(self.canary[i], self.part[i], start, end)


class _Automaton:
    """Distinct patterns in one automaton (`utf8_matches`).  Pickled as its patterns (`ahocorasick_rs` automata are
    not picklable), the automaton built again where it lands."""

    def __init__(self, entries: Iterable[tuple[str, int, int]]) -> None:
        patterns, self._owners = _Owners.of(entries)
        self._patterns = [p.encode() for p in patterns]
        self._build()

    def _build(self) -> None:
        self._automaton = (ahocorasick_rs.BytesAhoCorasick(self._patterns, implementation=CONTIGUOUS)
                           if self._patterns else None)
        self.holds = self._automaton is not None

    def __getstate__(self) -> dict[str, Any]:
        return {"owners": self._owners, "patterns": self._patterns}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._owners, self._patterns = state["owners"], state["patterns"]
        self._build()

    def find(self, text: str) -> list[Match]:
        if self._automaton is None:
            return []
        return [match for pattern, start, end in utf8_matches(self._automaton, text)
                for match in self._owners.matches(pattern, start, end)]


def utf8_matches(automaton: ahocorasick_rs.BytesAhoCorasick, text: str) -> list[tuple[int, int, int]]:
    """(pattern, start, end) of every match of `automaton` in `text`, overlapping ones too, in characters.  It reads
    UTF-8: an answer's bytes are ready at once where a str haystack is converted on each call (15% slower; a
    pure-Python automaton read Korean at ~35 ns a character); UTF-8 never matches across a character, and the
    offsets of the rare match in a text outside ASCII are mapped back to characters."""
    data = text.encode()
    found = automaton.find_matches_as_indexes(data, overlapping=True)
    if found and len(data) != len(text):
        return [(p, len(data[:s].decode()), len(data[:e].decode())) for p, s, e in found]
    return found


class _Pieces:
    """The pieces of token bodies that a detector reads: a numpy table of those in the token alphabet (pieces.py),
    read a batch of answers at a time, each found piece weighed there (bags.py); and an automaton of any other
    piece.  A piece found by chance in compact English (six an answer) is dropped here, in numpy, unless its body
    could score around it or its group is there whole."""

    def __init__(self, entries: Iterable[tuple[str, int, int]], patterns: Sequence[str]) -> None:
        pieces, self._owners = _Owners.of(entries)
        self._table = PieceTable(pieces)
        self._bags = TokenBags(patterns)
        self._others = _Automaton(entry for i in self._table.outside for entry in self._owners.entries(i, pieces[i]))

    def find(self, texts: Sequence[str]) -> list[list[Match]]:
        batch = Batch.of(texts)
        found = self._table.find(batch)
        owners = self._owners
        first = np.frombuffer(owners.first, dtype=np.int32)[found.pattern]
        count = np.frombuffer(owners.first, dtype=np.int32)[found.pattern + 1] - first
        row = np.repeat(np.arange(len(count)), count)  # a piece's place in `found`, once per owner of it
        owner = np.arange(len(row)) - np.repeat(np.cumsum(count) - count, count) + first[row]
        canary = np.frombuffer(owners.canary, dtype=np.int32)[owner]
        part = np.frombuffer(owners.part, dtype=np.int8)[owner]
        answer, start, end = found.answer[row], found.start[row], found.end[row]
        body = start - np.asarray(CUTS)[part]
        size = np.asarray([len(d) for d in batch.data], dtype=np.int64)[answer]
        begin = batch.starts[answer] + np.maximum(body - REACH, 0)
        shared = self._bags.shared(batch.joined, canary, begin,
                                   batch.starts[answer] + np.minimum(body + tokens.BODY_LEN + REACH, size))
        # Kept: what a detector reads -- a body that could score there (fuzzy), a group there whole (fragment),
        # and every piece of an answer that is not ASCII, whose offsets are not the bytes'.
        group = np.asarray([GROUP_OF_PIECE.get(k, -1) for k in range(len(CUTS) - 1)])[part]
        whole = (group >= 0) & self._bags.same(batch.joined, canary, GROUP * group,
                                                batch.starts[answer] + body + GROUP * group, GROUP)
        wide = np.asarray([len(d) != len(t) for d, t in zip(batch.data, texts, strict=True)])[answer]
        keep = (shared >= SCORABLE) | whole | wide
        canary, part, answer, start, end, shared = (a[keep] for a in (canary, part, answer, start, end, shared))
        matches = list(map(Match._make, zip(canary.tolist(), part.tolist(), start.tolist(), end.tolist(),
                                            shared.tolist(), strict=True)))
        found_in: list[list[Match]] = [[] for _ in texts]
        for n, begin_at, end_at in _runs(answer):  # the few answers that hold a piece kept
            found_in[n] = _in_characters(matches[begin_at:end_at], batch.data[n], texts[n])
        if self._others.holds:
            found_in = [self._others.find(text) + each for text, each in zip(texts, found_in, strict=True)]
        return found_in


def _runs(values: npt.NDArray[np.int64]) -> Iterator[tuple[int, int, int]]:
    """(value, first, last) of each run of equal values in a sorted array."""
    if not len(values):
        return
    edges = [0, *(np.flatnonzero(np.diff(values)) + 1).tolist(), len(values)]
    for first, last in pairwise(edges):
        yield int(values[first]), first, last


def _in_characters(matches: list[Match], data: bytes, text: str) -> list[Match]:
    """Byte offsets as character offsets in the rare answer that is not ASCII (UTF-8 never holds an ASCII byte
    inside another character, so a piece found in bytes is one in characters), whose stretches are not counted."""
    if len(data) == len(text) or not matches:
        return matches
    return [Match(m.canary, m.part, len(data[: m.start].decode()), len(data[: m.end].decode())) for m in matches]


class PatternIndex:
    """The automata and tables of one canary set, shared by its exact, fuzzy and fragment detectors.

    A whole body is found through its first piece (the batch's search of pieces, which the fuzzy and fragment
    detectors read too), then compared whole: no automaton of the bodies or their tags is read or held (a DFA of
    50,000 tags held 71 MiB and read each answer again).  Facts are a contiguous NFA (a DFA of them would be large;
    bench/detect.py)."""

    def __init__(self, canaries: CanarySet) -> None:
        bodies = [i for i in range(len(canaries.patterns)) if is_body(canaries, i)]
        in_bodies = set(bodies)
        self.others = _Automaton((p, i, 0) for i, p in enumerate(canaries.patterns) if p and i not in in_bodies)
        self.pieces = _Pieces(((canaries.patterns[i][CUTS[k] : CUTS[k + 1]], i, k)
                               for i in bodies for k in range(len(CUTS) - 1)), canaries.patterns)
        self._patterns = canaries.patterns
        self._recent: Recent[list[Match]] = Recent()

    def whole_in(self, compacted: str) -> Whole:
        """Every canary's whole pattern (a token's body, a fact's text) in the compact answer, and where the
        tokens' prefix lies (a body this set never saw may follow it)."""
        found = self.others.find(compacted)
        patterns = self._patterns
        for piece in self.pieces_in(compacted):
            if piece.part == 0 and compacted.startswith(patterns[piece.canary], piece.start):
                found.append(Match(piece.canary, 0, piece.start, piece.start + tokens.BODY_LEN))
        return Whole(found, _ends(compacted, tokens.COMPACT_PREFIX))

    def pieces_in(self, compacted: str) -> list[Match]:
        """Every piece of a token body in the compact answer (searched with its batch, `PieceReader`)."""
        return self._recent.get(compacted, lambda: self.pieces.find([compacted])[0])

    def read_pieces(self, batch: Sequence[str]) -> list[list[Match]]:
        """The pieces of a batch of compact answers (at most BATCH: as many are kept), searched at once."""
        return self._recent.get_many(batch, self.pieces.find)


def _ends(text: str, needle: str) -> list[int]:
    """Where each occurrence of `needle` in `text` ends (str.find: a memchr-fast scan)."""
    ends, at = [], text.find(needle)
    while at >= 0:
        ends.append(at + len(needle))
        at = text.find(needle, at + 1)
    return ends


def is_body(canaries: CanarySet, index: int) -> bool:
    """Whether pattern `index` is a token's 32-character body."""
    return (canaries.canaries[index].kind is CanaryKind.TOKEN
            and len(canaries.patterns[index]) == tokens.BODY_LEN)


class PieceReader(Detector):
    """A detector that reads the pieces of token bodies (fuzzy, fragment): a batch's are found in one search,
    which the other such detector then finds kept."""

    patterns: PatternIndex

    def worth_reading(self, compacted: str) -> bool:
        """Whether `detect` could find anything in an answer in which the batch's search found no piece (most
        answers, which then cost nothing more): no, unless the detector looks for more."""
        return False

    def detect_many(self, answers: Sequence[tuple[Record, str]]) -> list[list[Hit]]:
        hits: list[list[Hit]] = []
        for start in range(0, len(answers), BATCH):  # the pieces of as many answers as are kept
            batch = answers[start : start + BATCH]
            pieces = self.patterns.read_pieces([compacted for _, compacted in batch])
            hits += [self.detect(record, compacted) if found or self.worth_reading(compacted) else []
                     for (record, compacted), found in zip(batch, pieces, strict=True)]
        return hits
