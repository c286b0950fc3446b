"""Where the canaries' patterns lie in a compact answer: Aho-Corasick automata (Rust, `ahocorasick_rs`), built
once per canary set and run once per answer each, whatever the number of canaries.

* **Whole patterns** for exact matching: a token body through its tag (its first group, `PatternIndex`), every
  other pattern (a fact's compact text) as it is.
* **Pieces of token bodies** for what a model copied with edits or in part.  Each 32-character body is cut into
  six pieces (`CUTS`): a body with up to five characters substituted keeps at least one piece intact
  (pigeonhole), so a fuzzy candidate is a body with a piece in the answer, scored around that place.  Each
  8-character group of a body holds one piece whole, so a group copied alone (a probe's tag, part of a body) is
  found through that piece, then confirmed on the text.

An automaton of tags reads an answer at about a nanosecond a character.  Short pieces would make a dense trie,
slow on compact English (~40 ns a character), so they are numbers in a table read a batch of answers at a time
(pieces.py) that only the fuzzy and fragment detectors pay for -- once per batch between them (`PieceReader`).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Any, NamedTuple

import ahocorasick_rs
import numpy as np

from prober.canaries import tokens
from prober.detect.bags import SCORABLE, TokenBags
from prober.detect.base import BATCH, CanarySet, Detector, Hit, Recent
from prober.detect.pieces import Batch, PieceTable
from prober.domain.types import CanaryKind, Record

CUTS = (0, 5, 11, 16, 21, 27, 32)  # piece k of a body is body[CUTS[k]:CUTS[k + 1]]
GROUP = 8  # characters in a group of a token body
GROUP_OF_PIECE = {0: 0, 2: 1, 3: 2, 5: 3}  # the group that holds each piece whole (pieces 1 and 4 straddle two)
CONTIGUOUS, DFA = ahocorasick_rs.Implementation.ContiguousNFA, ahocorasick_rs.Implementation.DFA
PREFIX_MARK = -2  # the canary number of the tokens' prefix in the tags' automaton
REACH = 8  # characters a model may add to a body, on each side of where its piece says the body is
MAX_DFA_TAGS = 50_000  # a DFA of 50,000 tags holds ~71 MiB (100,000: 136 MiB); more tags, a contiguous NFA


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
    """Distinct patterns in one automaton.  It reads UTF-8: an answer's bytes are ready at once where a str
    haystack is converted on each call (15% slower); UTF-8 never matches across a character, and the offsets of
    the rare non-ASCII answer are mapped back to characters.  Pickled as its patterns (`ahocorasick_rs` automata
    are not picklable), the automaton built again where it lands."""

    def __init__(self, entries: Iterable[tuple[str, int, int]],
                 implementation: ahocorasick_rs.Implementation = CONTIGUOUS) -> None:
        patterns, self._owners = _Owners.of(entries)
        self._patterns = [p.encode() for p in patterns]
        self._implementation = implementation
        self._build()

    def _build(self) -> None:
        self._automaton = (ahocorasick_rs.BytesAhoCorasick(self._patterns, implementation=self._implementation)
                           if self._patterns else None)
        self.holds = self._automaton is not None

    def __getstate__(self) -> dict[str, Any]:
        return {"owners": self._owners, "patterns": self._patterns, "implementation": str(self._implementation)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._owners, self._patterns = state["owners"], state["patterns"]
        self._implementation = getattr(ahocorasick_rs.Implementation, state["implementation"].rpartition(".")[2])
        self._build()

    def find(self, text: str) -> list[Match]:
        if self._automaton is None:
            return []
        data = text.encode()
        found = self._automaton.find_matches_as_indexes(data, overlapping=True)
        if found and len(data) != len(text):
            found = [(p, len(data[:s].decode()), len(data[:e].decode())) for p, s, e in found]
        return [match for pattern, start, end in found for match in self._owners.matches(pattern, start, end)]


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
        bounds = np.searchsorted(answer, np.arange(len(texts) + 1)).tolist()
        found_in = [_in_characters(matches[bounds[n] : bounds[n + 1]], data, text)
                    for n, (text, data) in enumerate(zip(texts, batch.data, strict=True))]
        if self._others.holds:
            found_in = [self._others.find(text) + each for text, each in zip(texts, found_in, strict=True)]
        return found_in


def _in_characters(matches: list[Match], data: bytes, text: str) -> list[Match]:
    """Byte offsets as character offsets in the rare answer that is not ASCII (UTF-8 never holds an ASCII byte
    inside another character, so a piece found in bytes is one in characters), whose stretches are not counted."""
    if len(data) == len(text) or not matches:
        return matches
    return [Match(m.canary, m.part, len(data[: m.start].decode()), len(data[: m.end].decode())) for m in matches]


class PatternIndex:
    """The automata of one canary set, shared by its exact, fuzzy and fragment detectors.

    Whole bodies are found through their first group (the probe's tag, shared by the probe's tokens), and the 32
    characters at a tag are looked up whole: a DFA of the tags reads an answer 2.8x as fast as a contiguous NFA of
    every body, and stays small where a DFA of the bodies would not (600 MiB at 100,000 bodies; 71 MiB for 50,000
    tags, one per probe).  Facts and pieces, whose automata a DFA would make large, are contiguous NFAs (1.4x the
    library's own pick on pieces; bench/detect.py)."""

    def __init__(self, canaries: CanarySet) -> None:
        bodies = [i for i in range(len(canaries.patterns)) if is_body(canaries, i)]
        grouped: dict[str, list[int]] = {}
        for i in bodies:
            grouped.setdefault(canaries.patterns[i], []).append(i)
        # Tuples of ints, which the garbage collector stops tracking (lists it would walk in every forked worker).
        self.bodies = {body: tuple(ids) for body, ids in grouped.items()}
        tags = {canaries.patterns[i][:GROUP] for i in bodies}
        # The tokens' prefix rides along (canary PREFIX_MARK): where it lies, a body this set never saw may follow.
        self.tags = _Automaton([(tokens.COMPACT_PREFIX, PREFIX_MARK, 0), *((tag, -1, 0) for tag in tags)],
                               DFA if len(tags) <= MAX_DFA_TAGS else CONTIGUOUS)
        in_bodies = set(bodies)
        self.others = _Automaton((p, i, 0) for i, p in enumerate(canaries.patterns) if p and i not in in_bodies)
        self.pieces = _Pieces(((canaries.patterns[i][CUTS[k] : CUTS[k + 1]], i, k)
                               for i in bodies for k in range(len(CUTS) - 1)), canaries.patterns)
        self._recent: Recent[list[Match]] = Recent()

    def whole_in(self, compacted: str) -> Whole:
        """Every canary's whole pattern (a token's body, a fact's text) in the compact answer, and where the
        tokens' prefix lies -- in the same pass, so an answer without it costs no second search."""
        found, prefixes = self.others.find(compacted), []
        for tag in self.tags.find(compacted):
            if tag.canary == PREFIX_MARK:
                prefixes.append(tag.end)
                continue
            end = tag.start + tokens.BODY_LEN
            found.extend(Match(canary, 0, tag.start, end) for canary in self.bodies.get(compacted[tag.start : end], ()))
        return Whole(found, prefixes)

    def pieces_in(self, compacted: str) -> list[Match]:
        """Every piece of a token body in the compact answer (searched with its batch, `PieceReader`)."""
        return self._recent.get(compacted, lambda: self.pieces.find([compacted])[0])

    def read_pieces(self, batch: Sequence[str]) -> None:
        """The pieces of a batch of compact answers (at most BATCH: as many are kept), searched at once."""
        self._recent.get_many(batch, self.pieces.find)


def is_body(canaries: CanarySet, index: int) -> bool:
    """Whether pattern `index` is a token's 32-character body."""
    return (canaries.canaries[index].kind is CanaryKind.TOKEN
            and len(canaries.patterns[index]) == tokens.BODY_LEN)


class PieceReader(Detector):
    """A detector that reads the pieces of token bodies (fuzzy, fragment): a batch's are found in one search,
    which the other such detector then finds kept."""

    patterns: PatternIndex

    def detect_many(self, answers: Sequence[tuple[Record, str]]) -> list[list[Hit]]:
        hits: list[list[Hit]] = []
        for start in range(0, len(answers), BATCH):  # the pieces of as many answers as are kept
            batch = answers[start : start + BATCH]
            self.patterns.read_pieces([compacted for _, compacted in batch])
            hits += super().detect_many(batch)
        return hits
