"""A fact's distinctive values found in an answer, in every spelling a model writes them: one Aho-Corasick pass
over the compact answer, shared by the semantic detector (which facts could be there) and the fragment
detector (a person's full name on its own).

* A value counts whole; a two-word name also in the other order; a part of a multi-word value of at least
  MIN_PART characters counts on its own, but is never strong.
* A Korean name or place also counts in Latin letters: as its Revised Romanization, and spelled any other
  common way ("Tahk Yoon-sul", "Sunwoo", "Chinmeelee"): a second automaton runs over the answer's
  romanization key (`hangul.romanization_key`), and each key match is confirmed on the whole words of the
  answer around it, whose key must be the value's (a person's given name, with the family name in the word
  before or after it for the name in full).
* A value is *strong* -- rare enough to attribute on -- when it is a number of three digits or more, a name in
  full, or a Korean value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Generic, NamedTuple, TypeVar

import ahocorasick_rs

from prober.canaries import hangul
from prober.canaries.compact import compact, original_span
from prober.detect.base import CanarySet, Recent
from prober.detect.patterns import utf8_matches

MIN_PART = 5  # compact length of a slot-value part that may count on its own
# A one-word made-up name (a place, a pet) this long or longer may be as rare as a person's name: a place is one of
# 41 million a pack makes, a pet one of 110,592; two syllables ("Morwen") are too few.  Whether a name is rare enough
# to attribute alone, given how many the index holds, is the fragment detector's to weigh (`FactPack.chance`).
MIN_WORD_NAME = 8
MIN_KEY = 3  # a romanization key shorter than this matches too much to look for
AROUND = 2  # words before or after a given name where its family name may be
_WORD = re.compile(r"[A-Za-z]+")
_LATIN_RUN = re.compile(f"[A-Z0-9]{{{MIN_KEY},}}")  # a run long enough for a key of MIN_KEY, compacted
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z\s'’-]")
T = TypeVar("T")
KEY_MEMO = 1 << 16  # runs of words whose key was computed: an answer confirms the same few words over and over


class ValueHit(NamedTuple):
    """One of a fact's values found in an answer (offsets in the compact form, then in the original)."""

    slot: int
    start: int
    end: int
    strong: bool  # a number, a name in full, a Korean value: rare enough to attribute on
    name: bool = False  # a name: a person's in full, or a made-up word (`SlotValues.word_names`)
    near: bool = False  # written with an edit or two, next to values found as they are (semantic.py)


def strong(value: str) -> bool:
    """Whether a value, found whole, is rare enough to attribute on."""
    return sum(ch.isdigit() for ch in value) >= 3 or len(value.split()) >= 2 or not value.isascii()


def is_name(value: str, alias: str = "") -> bool:
    """A person's name: two words of letters, or a Korean value whose romanization is two words."""
    if hangul.is_hangul(value):
        return len(alias.split()) == 2
    words = value.split()
    return len(words) == 2 and all(w.isalpha() for w in words)


def is_word_name(value: str) -> bool:
    """A made-up one-word name (a place, a pet): capitalised letters, long enough to be rare."""
    return value.isascii() and value.isalpha() and value[:1].isupper() and len(compact(value)) >= MIN_WORD_NAME


def family_length(value: str, alias: str) -> int:
    """Syllables of a Korean name's family name, read off its romanized alias ("Seonu Harin": two)."""
    family = alias.split()[0].lower()
    return next((n for n in (2, 1) if hangul.romanize(value[:n]) == family), 1)


@dataclass(frozen=True)
class _Latin:
    """What a Korean value's romanization key stands for: its fact and slot, and the keys a match must have."""

    fact: int
    slot: int
    whole: str  # the key of the value (a person: of the given name)
    names: tuple[str, ...] = ()  # a person's name in full, family name first or last


class SlotValues:
    """Which facts' values an answer holds: fact index -> its value hits (compact offsets)."""

    def __init__(self, canaries: CanarySet) -> None:
        self.canaries = canaries
        self._automaton: _Words[tuple[int, int, bool, bool]] = _Words()
        self._latin: _Words[_Latin] = _Words()
        self.names: set[tuple[int, int]] = set()  # (fact, slot) of every name: a person's, a made-up word's
        self.word_names: set[tuple[int, int]] = set()  # of those, the one-word names
        for index in canaries.facts():
            canary = canaries.canaries[index]
            spelled = dict(canary.aliases)
            for slot, value in enumerate(canary.values):
                alias = spelled.get(slot, "")
                if is_name(value, alias) or is_word_name(value):
                    self.names.add((index, slot))
                if is_word_name(value):
                    self.word_names.add((index, slot))
                self._add_value(index, slot, value)
                if alias:
                    self._add_value(index, slot, alias)
                if alias and hangul.is_hangul(value):
                    self._add_latin(index, slot, value, alias)
        self._automaton.build()
        self._latin.build()
        self._recent: Recent[dict[int, list[ValueHit]]] = Recent()

    def _add_value(self, index: int, slot: int, value: str) -> None:
        words = value.split()
        wholes = {compact(value), compact(" ".join(reversed(words)))} if len(words) == 2 else {compact(value)}
        name = (index, slot) in self.names
        entries = [(w, strong(value), name) for w in wholes]
        entries += [(p, False, False) for p in {compact(w) for w in words if len(compact(w)) >= MIN_PART} - wholes]
        for text, is_strong, is_name_hit in entries:
            if text:
                self._automaton.add(text, (index, slot, is_strong, is_name_hit))

    def _add_latin(self, index: int, slot: int, value: str, alias: str) -> None:
        """A Korean value's romanization key (a person: the given name's, and the name's in full both ways)."""
        if len(alias.split()) == 2:
            cut = family_length(value, alias)
            family, given = (_key(hangul.romanize(part)) for part in (value[:cut], value[cut:]))
            names = (_key(family + given), _key(given + family))
            targets = {given, *names} if len(given) >= MIN_KEY else set(names)
            entry = _Latin(index, slot, given, names)
        else:
            targets, entry = {_key(hangul.romanize(value))}, _Latin(index, slot, _key(hangul.romanize(value)))
        for target in targets:
            if len(target) >= MIN_KEY:
                self._latin.add(target, entry)

    def hits(self, text: str, compacted: str) -> dict[int, list[ValueHit]]:
        """The values in an answer (`compacted` = compact(text)), by fact (not to be changed by the caller)."""
        return self._recent.get(compacted, lambda: self._find(text, compacted))

    def _find(self, text: str, compacted: str) -> dict[int, list[ValueHit]]:
        found: dict[int, list[ValueHit]] = {}
        for start, end, entries in self._automaton.find(compacted):
            for index, slot, is_strong, name in entries:
                found.setdefault(index, []).append(ValueHit(slot, start, end, is_strong, name))
        if self._latin.holds:
            for hit in self._latin_hits(text, compacted):
                if hit[1] not in found.get(hit[0], []):
                    found.setdefault(hit[0], []).append(hit[1])
        return found

    def _latin_hits(self, text: str, compacted: str) -> list[tuple[int, ValueHit]]:
        """Keys matched run by run of Latin letters and digits: a key's steps look at no character outside the
        alphabet, so a run's key is the whole text's key there, and a Korean answer's text is never keyed."""
        out: list[tuple[int, ValueHit]] = []
        for run in _LATIN_RUN.finditer(compacted):
            matches = self._latin.find(hangul.romanization_key(run.group()))
            if not matches:
                continue
            _, positions = hangul.romanization_key_positions(run.group())
            for begin, end, entries in matches:
                at, last = run.start() + positions[begin], run.start() + positions[end - 1]
                start, stop = original_span(text, at, last + 1)
                words = _words_around(text, start, stop)
                if words is None:
                    continue
                for entry in entries:
                    hit = _confirm(text, words, entry)
                    if hit is not None:
                        out.append((entry.fact, hit))
        return out


class _Words(Generic[T]):
    """Patterns, each with what it stands for, found in one pass of an automaton over a text's UTF-8
    (`utf8_matches`)."""

    def __init__(self) -> None:
        self._entries: dict[str, list[T]] = {}
        self._automaton: ahocorasick_rs.BytesAhoCorasick | None = None

    def add(self, pattern: str, entry: T) -> None:
        self._entries.setdefault(pattern, []).append(entry)

    def build(self) -> None:
        self._payloads = [tuple(entries) for entries in self._entries.values()]
        if self._entries:
            self._automaton = ahocorasick_rs.BytesAhoCorasick([p.encode() for p in self._entries])
        self._entries = {}

    @property
    def holds(self) -> bool:
        return self._automaton is not None

    def find(self, text: str) -> list[tuple[int, int, tuple[T, ...]]]:
        """Every match, overlapping ones too: (start, end, what its pattern stands for)."""
        if self._automaton is None:
            return []
        return [(start, end, self._payloads[pattern]) for pattern, start, end in utf8_matches(self._automaton, text)]


@lru_cache(maxsize=KEY_MEMO)
def _key(latin: str) -> str:
    return hangul.romanization_key(compact(latin))


def _words_around(text: str, start: int, stop: int) -> list[re.Match[str]] | None:
    """The Latin words that the span touches, with AROUND words on each side; None outside Latin words."""
    words = list(_WORD.finditer(text, max(0, start - 80), min(len(text), stop + 80)))
    inside = [i for i, w in enumerate(words) if w.start() < stop and start < w.end()]
    if not inside:
        return None
    first, last = max(0, inside[0] - AROUND), min(len(words), inside[-1] + AROUND + 1)
    return words[first:last] if words[inside[0]].start() <= start and stop <= words[inside[-1]].end() else None


def _confirm(text: str, words: list[re.Match[str]], entry: _Latin) -> ValueHit | None:
    """The run of whole words whose key is the value's (or, for a person, the name's in full): a value hit in
    compact offsets, strong when it is the name in full."""
    best: ValueHit | None = None
    for first in range(len(words)):
        for last in range(first, len(words)):
            span = text[words[first].start() : words[last].end()]
            if _NOT_IN_A_NAME.search(span):
                break  # a run of a name does not cross punctuation or digits
            key = _key(span)
            full = key in entry.names
            if not full and (key != entry.whole or (entry.names and len(compact(span)) < MIN_PART)):
                continue  # not the value; or a given name too short to count without its family name
            at = len(compact(text[: words[first].start()]))
            hit = ValueHit(entry.slot, at, at + len(compact(span)), full, full)
            if best is None or (hit.strong and not best.strong):
                best = hit
    return best
