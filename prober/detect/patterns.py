"""Where the canaries' patterns lie in a compact answer: Aho-Corasick automata (Rust, `ahocorasick_rs`), built
once per canary set and run once per answer each, whatever the number of canaries.

* **Whole patterns** for exact matching: a token body through its tag (its first group, `PatternIndex`), every
  other pattern (a fact's compact text) as it is.
* **Pieces of token bodies** for what a model copied with edits or in part.  Each 32-character body is cut into
  six pieces (`CUTS`): a body with up to five characters substituted keeps at least one piece intact
  (pigeonhole), so a fuzzy candidate is a body with a piece in the answer, scored around that place.  Each
  8-character group of a body holds one piece whole, so a group copied alone (a probe's tag, part of a body) is
  found through that piece, then confirmed on the text.

An automaton of tags reads an answer at about a nanosecond a character; short pieces make a dense trie, slower
per character (bench/detect.py), so they have an automaton of their own that only the fuzzy and fragment
detectors pay for -- once per answer between them (`Recent`).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from itertools import accumulate
from typing import NamedTuple

import ahocorasick_rs

from prober.canaries import tokens
from prober.detect.base import CanarySet, Recent
from prober.domain.types import CanaryKind

CUTS = (0, 5, 11, 16, 21, 27, 32)  # piece k of a body is body[CUTS[k]:CUTS[k + 1]]
GROUP = 8  # characters in a group of a token body
GROUP_OF_PIECE = {0: 0, 2: 1, 3: 2, 5: 3}  # the group that holds each piece whole (pieces 1 and 4 straddle two)
CONTIGUOUS, DFA = ahocorasick_rs.Implementation.ContiguousNFA, ahocorasick_rs.Implementation.DFA
PREFIX_MARK = -2  # the canary number of the tokens' prefix in the tags' automaton
MAX_DFA_TAGS = 50_000  # a DFA of 50,000 tags holds ~71 MiB (100,000: 136 MiB); more tags, a contiguous NFA


class Match(NamedTuple):
    """Canary `canary`'s pattern (or its piece `part`) at [start, end) of the compact answer."""

    canary: int
    part: int
    start: int
    end: int

    @property
    def body_start(self) -> int:
        """Where the token body would start, for a piece of it."""
        return self.start - CUTS[self.part]


class Whole(NamedTuple):
    """What `PatternIndex.whole_in` found in one answer."""

    matches: list[Match]
    after_prefixes: list[int]  # where the tokens' prefix ends: a body may start there


class _Automaton:
    """Distinct patterns in one automaton; each stands for every (canary, part) that has it (a probe's tag is in
    all of its tokens, a fact's text may be two tenants').  It reads UTF-8: an answer's bytes are ready at once
    where a str haystack is converted on each call (15% slower); UTF-8 never matches across a character, and
    the offsets of the rare non-ASCII answer are mapped back to characters."""

    def __init__(self, entries: Iterable[tuple[str, int, int]],
                 implementation: ahocorasick_rs.Implementation = CONTIGUOUS) -> None:
        owners: dict[bytes, list[tuple[int, int]]] = {}
        for pattern, canary, part in entries:
            owners.setdefault(pattern.encode(), []).append((canary, part))
        # Flat arrays, not a list per pattern: a million small lists cost ~150 MB, and a forked scan worker's
        # garbage collector would touch (copy) every one of them.
        self._first = array("i", accumulate((len(o) for o in owners.values()), initial=0))
        self._canary = array("i", (canary for o in owners.values() for canary, _ in o))
        self._part = array("b", (part for o in owners.values() for _, part in o))
        self._automaton = (ahocorasick_rs.BytesAhoCorasick(list(owners), implementation=implementation) if owners
                           else None)

    def find(self, text: str) -> list[Match]:
        if self._automaton is None:
            return []
        data = text.encode()
        found = self._automaton.find_matches_as_indexes(data, overlapping=True)
        if found and len(data) != len(text):
            found = [(p, len(data[:s].decode()), len(data[:e].decode())) for p, s, e in found]
        return [Match(self._canary[i], self._part[i], start, end)
                for pattern, start, end in found for i in range(self._first[pattern], self._first[pattern + 1])]


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
        self.pieces = _Automaton((canaries.patterns[i][CUTS[k] : CUTS[k + 1]], i, k)
                                 for i in bodies for k in range(len(CUTS) - 1))
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
        """Every piece of a token body in the compact answer; an answer of the batch is searched once."""
        return self._recent.get(compacted, lambda: self.pieces.find(compacted))


def is_body(canaries: CanarySet, index: int) -> bool:
    """Whether pattern `index` is a token's 32-character body."""
    return (canaries.canaries[index].kind is CanaryKind.TOKEN
            and len(canaries.patterns[index]) == tokens.BODY_LEN)
