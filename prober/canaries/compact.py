"""The compact normal form: what is left of a text once a model's reformatting is undone.

    NFKC  ->  upper case  ->  look-alikes to Latin  ->  Crockford aliases (O->0, I/L->1, U->V)
          ->  drop white space, separators, punctuation and zero-width characters

"LPK-7f3a 9QZ0..." and "lpk7F3A\\n9qzO..." compact to the same string, so one exact search finds a
canary however a model re-cased, spaced, broke or hyphenated it, or swapped a Cyrillic "А" in.  All of
it runs in C (`str.upper`, `str.translate`, `unicodedata.normalize`).
"""

from __future__ import annotations

import string
import unicodedata
from functools import lru_cache

import numpy as np
import numpy.typing as npt

# Upper-case look-alikes (Cyrillic, Greek) of Latin capitals and digits.
_LOOKALIKES = {
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "0", "Р": "P", "С": "C", "Т": "T",
    "Х": "X", "У": "Y", "Ѕ": "S", "І": "1", "Ј": "J", "Ԁ": "D", "Ԛ": "Q", "Ԝ": "W",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "1", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "0",
    "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
}
_ALIASES = {"O": "0", "I": "1", "L": "1", "U": "V"}
_DROP = (
    string.whitespace + string.punctuation
    + "\u00a0\u00ad\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u200b\u200c\u200d"
    + "\u2010\u2011\u2012\u2013\u2014\u2015\u2018\u2019\u201c\u201d\u2026\u2028\u2029\u202f\u205f\u2060"
    + "\u3000\u3001\u3002\ufeff\u00b7\u30fb\uff0c\uff0e"
)
_TABLE = str.maketrans({**_LOOKALIKES, **_ALIASES, **dict.fromkeys(_DROP)})


def _compact_text(text: str) -> str:
    return unicodedata.normalize("NFKC", text).upper().translate(_TABLE)


# The same for ASCII text as one bytes.translate (NFKC leaves ASCII as it is): twice as fast as the str path, whose
# dict-driven translate is most of its time.  Derived from the str path, character by character.
_ASCII_DROP = bytes(b for b in range(128) if not _compact_text(chr(b)))
_ASCII_TABLE = bytes(ord(_compact_text(chr(b)) or "\0") for b in range(128)) + bytes(range(128, 256))
_ASCII_KEPT = np.array([b not in _ASCII_DROP for b in range(256)])


# The same translate for other text, as one numpy lookup of its code points: str.translate reads a dict table
# character by character, which was most of a Korean answer's compaction.  Every entry of the table is one
# character or none, and all are in the Basic Multilingual Plane.
_BMP_TABLE = np.arange(0x10000, dtype=np.int32)
_BMP_TABLE[list(_TABLE)] = [-1 if v is None else ord(v) for v in _TABLE.values()]


def compact(text: str) -> str:
    """The normal form used for exact and fuzzy matching."""
    if text.isascii():
        return text.encode().translate(_ASCII_TABLE, _ASCII_DROP).decode("ascii")
    upper = unicodedata.normalize("NFKC", text).upper()
    codes = np.frombuffer(upper.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    if codes.max() >= 0x10000:  # beyond the plane (an emoji): the table as it is
        return upper.translate(_TABLE)
    kept = _BMP_TABLE[codes]
    return kept[kept >= 0].astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")


@lru_cache(maxsize=4096)
def _char_compact_len(ch: str) -> int:
    return len(compact(ch))


@lru_cache(maxsize=1)
def _plane_lengths() -> npt.NDArray[np.int64]:
    """The compact length of every character of the Basic Multilingual Plane (0 to 3; once per process, a third of
    a second, where an answer outside ASCII is first mapped back)."""
    return np.asarray([len(_compact_text(chr(c))) for c in range(0x10000)], dtype=np.int64)


@lru_cache(maxsize=4)
def offsets(text: str) -> npt.NDArray[np.int64]:
    """For each position of compact(text), the index of the original character it came from (read-only).

    Computed per character, so only for the few texts that matched, and once per text: every hit of
    every detector in one answer maps its span through the same array.  Where NFKC composes several
    characters into one, positions can be off by a character; they are used for excerpts.
    """
    if text.isascii():  # one compact character or none per character: the kept ones' indices
        mapped = np.flatnonzero(_ASCII_KEPT[np.frombuffer(text.encode(), dtype=np.uint8)]).astype(np.int64)
    else:
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        if codes.max() < 0x10000:
            lengths = _plane_lengths()[codes]
        else:
            lengths = np.asarray([_char_compact_len(ch) for ch in text], dtype=np.int64)
        mapped = np.repeat(np.arange(len(text), dtype=np.int64), lengths)
    mapped.flags.writeable = False  # shared by every caller through the cache
    return mapped


def original_span(text: str, start: int, end: int) -> tuple[int, int]:
    """Map a [start, end) span of compact(text) back to a span of text."""
    index = offsets(text)
    if len(index) == 0:
        return 0, 0
    start = min(max(start, 0), len(index) - 1)
    last = min(max(end - 1, start), len(index) - 1)
    return int(index[start]), int(index[last]) + 1
