"""Garbled output: an answer no healthy model writes, whoever's data is in it.

An engine that corrupts what a model attends to or samples -- KV pages restored before their copy landed (vLLM
#45704, #47282: "no error or crash; the only symptom is garbled output on later requests"), tokens of a batch
handed to the wrong request (vLLM PR #14645) -- makes a multilingual model emit *salad*: pieces of its whole
vocabulary glued together, a few letters of Arabic inside an English word, Thai after Hangul, Cyrillic after
Greek.  Healthy text mixes scripts too, but word by word: a Korean answer writes `Python으로` and `학교(學校)`, a
Japanese one kanji, kana and Latin in one run, a list of greetings `Привет`, `Γειά σου` and `こんにちは`,
each a word of its own between spaces.

So, per answer, the rules are on the Unicode Script property of each letter (from the `regex` package's Unicode
tables: `unicodedata` has no script):

* a *clash* is two letters of different scripts with no white space between them (punctuation and digits do
  not separate them) that no writing system joins: Latin with Han, Hangul, kana or Bopomofo (a Latin term
  inside CJK text), Latin with Greek (units and formulas), Han with Hangul, kana or Bopomofo, and
  hiragana with katakana are joined; anything else clashes.  The ideographs of the CJK extensions (rare and
  historic characters, outside the unified block and the compatibility forms Korean Hanja are often encoded
  in) and the letters of historic scripts count as a script of their own, which joins nothing;
* an answer is garbled where MIN_CLASHES clashes among three scripts or more lie within SPAN characters, or
  MIN_BROKEN characters that no text holds -- U+FFFD, unassigned or private-use code points, control
  characters but ESC (a terminal's colour codes) -- lie within SPAN (a replacement character that ends the
  answer is a cut multi-byte character, not garble).

One stray token of another script (a small model sampling at temperature 1 writes `চুপemaker` now and then) or
a canary written with look-alike letters (Latin and Cyrillic: two scripts) is not garble.  Measured on clean
Gemma 3 270M answers in English and Korean and on the reference engine's `offload_restore_unsynced`:
docs/benchmarks.md.  Salad that stays in one script (`single de single or de laer`) is not caught here: a
healthy small model loops in one script as well.  Reported at warning, naming no victim.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import numpy.typing as npt
import regex

from prober.detect.base import Detector, Hit
from prober.domain.evidence import Garbled
from prober.domain.types import DetectorName, FindingKind, Record, Severity

MIN_CLASHES = 3
MIN_SCRIPTS = 3  # scripts among the clashing letters
MIN_BROKEN = 2
SPAN = 200  # characters within which clashes (or broken characters) count together

# Scripts that are written today, each its own code; the letters of any other script (historic ones) share one.
SCRIPTS = ("Latin", "Greek", "Cyrillic", "Armenian", "Hebrew", "Arabic", "Syriac", "Thaana", "NKo", "Devanagari",
           "Bengali", "Gurmukhi", "Gujarati", "Oriya", "Tamil", "Telugu", "Kannada", "Malayalam", "Sinhala", "Thai",
           "Lao", "Tibetan", "Myanmar", "Georgian", "Hangul", "Ethiopic", "Cherokee", "Canadian_Aboriginal", "Khmer",
           "Mongolian", "Tifinagh", "Hiragana", "Katakana", "Bopomofo", "Han", "Yi", "Lisu", "Vai", "Javanese",
           "Balinese", "Sundanese", "Ol_Chiki", "Adlam", "Coptic", "Glagolitic")
JOINED = (("Latin", "Han"), ("Latin", "Hangul"), ("Latin", "Hiragana"), ("Latin", "Katakana"), ("Latin", "Bopomofo"),
          ("Latin", "Greek"), ("Han", "Hangul"), ("Han", "Hiragana"), ("Han", "Katakana"), ("Han", "Bopomofo"),
          ("Hiragana", "Katakana"))
NEUTRAL, SPACE, BROKEN, OTHER = 0, 1, 2, 3  # codes below the scripts'; a script's code is FIRST + its index
FIRST = 4
NAMES = ("", "", "", "other", *SCRIPTS)


@cache
def _table() -> npt.NDArray[np.uint8]:
    """The code of every code point (1.1 MB, built once in about 0.2 s)."""
    everything = "".join(map(chr, range(0x110000))).encode("utf-32-le", "surrogatepass").decode(
        "utf-32-le", "surrogatepass")
    table = np.zeros(len(everything), dtype=np.uint8)

    def mark(pattern: str, code: int) -> None:
        for match in regex.finditer(pattern, everything, flags=regex.V1):
            table[match.start() : match.end()] = code

    mark(r"[\p{L}--\p{sc=Common}--\p{sc=Inherited}]+", OTHER)
    for index, script in enumerate(SCRIPTS):
        mark(rf"[\p{{L}}&&\p{{sc={script}}}]+", FIRST + index)
    mark(r"[\p{sc=Han}&&[\u3400-\u4DBF\U00020000-\U0003FFFF]]+", OTHER)  # the extensions' rare ideographs
    mark(r"[\p{Cn}\p{Co}\p{Cs}\p{Cc}\ufffd--\x1b]+", BROKEN)  # ESC opens a terminal's colour codes
    mark(r"\s+", SPACE)  # after the controls: tab and line breaks are white space
    return table


@cache
def _joined() -> npt.NDArray[np.bool_]:
    """Whether two codes may touch: the same script, or a pair that a writing system joins."""
    size = FIRST + len(SCRIPTS)
    joined = np.eye(size, dtype=np.bool_)
    for a, b in JOINED:
        i, j = FIRST + SCRIPTS.index(a), FIRST + SCRIPTS.index(b)
        joined[i, j] = joined[j, i] = True
    return joined


def _codes(text: str) -> npt.NDArray[np.uint8]:
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    return _table()[points]


def _windows(positions: npt.NDArray[np.intp], minimum: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """For each position that ends a window of `minimum` or more positions within SPAN characters: (the index of
    that last position, of the window's first).  Vectorised: a hostile answer may hold a clash at every letter."""
    starts = np.searchsorted(positions, positions - SPAN + 1)
    ends = np.flatnonzero(np.arange(len(positions)) - starts + 1 >= minimum)
    return ends, starts[ends]


def _stretch(positions: npt.NDArray[np.intp], end: int) -> int:
    """The last of the positions from `end` on that follow one another within SPAN: one stretch of salad."""
    gaps = np.flatnonzero(np.diff(positions[end:]) >= SPAN)
    return end + int(gaps[0]) if len(gaps) else len(positions) - 1


class GarbledOutputDetector(Detector):
    """Answers no healthy model writes: another script glued inside words, characters no text holds."""

    name = DetectorName.GARBLED
    rank = 6
    severity = Severity.WARNING

    def detect(self, record: Record, compacted: str) -> list[Hit]:
        text = record.text
        if text.isascii():
            return []  # one script, and the controls of ASCII alone are no salad
        codes = _codes(text.rstrip("\ufffd"))
        hit = self._clashes(codes)
        return [hit] if hit is not None else self._broken(codes)

    def _clashes(self, codes: npt.NDArray[np.uint8]) -> Hit | None:
        letters = np.flatnonzero(codes >= OTHER)
        if len(letters) < 2:
            return None
        spaces = np.cumsum(codes == SPACE)
        left, right = codes[letters[:-1]], codes[letters[1:]]
        touching = spaces[letters[:-1]] == spaces[letters[1:]]
        clash = np.flatnonzero(touching & ~_joined()[left, right])
        at = letters[clash]  # the first letter of each clash
        ends, starts = _windows(at, MIN_CLASHES)
        if not len(ends):
            return None
        left, right = left[clash], right[clash]
        present = np.zeros(len(ends), dtype=np.intp)  # scripts among each window's clashes
        for script in np.union1d(left, right):
            seen = np.concatenate(([0], np.cumsum((left == script) | (right == script))))
            present += seen[ends + 1] > seen[starts]
        found = np.flatnonzero(present >= MIN_SCRIPTS)
        if not len(found):
            return None
        first, last = int(starts[found[0]]), _stretch(at, int(ends[found[0]]))
        scripts = np.union1d(left[first : last + 1], right[first : last + 1])
        return Hit(self.name, min(1.0, (last - first + 1) / (2 * MIN_CLASHES)), int(at[first]),
                   int(letters[clash[last] + 1]) + 1, kind=FindingKind.GARBLED_OUTPUT,
                   evidence=(Garbled(last - first + 1, tuple(sorted(NAMES[int(c)] for c in scripts))),))

    def _broken(self, codes: npt.NDArray[np.uint8]) -> list[Hit]:
        broken = np.flatnonzero(codes == BROKEN)
        ends, starts = _windows(broken, MIN_BROKEN)
        if not len(ends):
            return []
        first, last = int(starts[0]), _stretch(broken, int(ends[0]))
        return [Hit(self.name, min(1.0, (last - first + 1) / (2 * MIN_BROKEN)), int(broken[first]),
                    int(broken[last]) + 1, kind=FindingKind.GARBLED_OUTPUT,
                    evidence=(Garbled(broken_characters=last - first + 1),))]
