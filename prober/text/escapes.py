"""Text escapes undone, with a map back to the original offsets: one grammar for what detection reads and what
the scrubber searches.

Web front-ends and log pipelines store an answer escaped, and a careless server echoes a credential the same
way: HTML character references (`&#76;&#80;&#75;`, `&#x4C;`, `&amp;`), URL percent-encoding (`%4C%50%4B`,
UTF-8 bytes for Korean), JSON and C-style escapes (`\\u004C`, surrogate pairs, `\\x4C`, `\\n`), and a backslash
before punctuation (JSON's `\\/`, Markdown's `\\-`).  A canary or a key written that way matches nothing, so
escapes are decoded here -- repeatedly, since a log may escape what was already escaped (`&amp;#76;`, `%2526`,
`\\\\u0073`) -- and every span found on the decoded text is mapped back to the characters of the original that
encode it, so excerpts, offsets and redactions stay true.

Only well-formed escapes are decoded; anything else (`50%`, `AT&T`, a lone backslash, a surrogate half,
bytes that are not UTF-8) is kept as written.  A backslash before `%` or `&` is kept too: what follows may be an
escape of its own.  Text without `&`, `%` or a backslash costs one scan for them.
"""

from __future__ import annotations

import bisect
import html.entities
import re
from dataclasses import dataclass
from typing import NamedTuple

MAX_ROUNDS = 3  # escaped, escaped again, and once more (a log of a proxy's log); deeper is not seen in practice
_ENTITY = re.compile(r"&(?:#[xX]([0-9a-fA-F]{1,6})|#([0-9]{1,7})|([A-Za-z][A-Za-z0-9]{1,31}));?")
# Runs of byte escapes (UTF-8 spread over several), \u escapes (surrogate pairs spread over two), and the
# one-character escapes of JSON and C.  Each pattern starts with a literal, so the regex engine skips in C to
# the next place it could match (an alternation at the top would try every position).
_BYTES = (re.compile(r"(?:%[0-9A-Fa-f]{2})+"), re.compile(r"(?:\\x[0-9A-Fa-f]{2})+"))
_UNICODE = re.compile(r"\\(?:u\{([0-9A-Fa-f]{1,6})\}|U([0-9A-Fa-f]{8})|u([0-9A-Fa-f]{4}))")
_CONTROL = {"n": "\n", "t": "\t", "r": "\r"}
_SIMPLE_RE = re.compile(r"\\([ntr]|[!-$'-/:-@\[-`{-~])")  # ASCII punctuation but % and &
_NAMED = {name.removesuffix(";"): text for name, text in html.entities.html5.items()}


class _Piece(NamedTuple):
    """One decoded piece: decoded[at : at + length] came from original[source : source + width]; where `step` is
    set, a run of one-character escapes of that width each (`%41%42`), so a character maps to its own escape."""

    at: int
    length: int
    source: int
    width: int
    step: int = 0


class _Map:
    """Decoded offsets of one round -> offsets of the text that round decoded."""

    def __init__(self, pieces: list[_Piece]) -> None:
        self._pieces = pieces
        self._starts: list[int] | None = None  # built at the first lookup: a decode that is only read needs none

    def position(self, at: int, end: bool) -> int:
        """Where decoded position `at` lies in the source: a start maps to the start of the escape holding
        it, an (exclusive) end to the end of the escape holding the character before it."""
        probe = at - 1 if end else at
        if self._starts is None:
            self._starts = [p.at for p in self._pieces]
        index = bisect.bisect_right(self._starts, probe) - 1
        if index < 0:
            return at
        piece = self._pieces[index]
        if probe < piece.at + piece.length:
            if piece.step:
                first = piece.source + (probe - piece.at) * piece.step
                return first + piece.step if end else first
            return piece.source + piece.width if end else piece.source
        return at - (piece.at + piece.length) + piece.source + piece.width


@dataclass(frozen=True)
class Unescaped:
    """The decoded text, which kinds of escape it held, and the way back to the original's offsets."""

    text: str
    kinds: tuple[str, ...]
    _maps: tuple[_Map, ...]

    def original_span(self, start: int, end: int) -> tuple[int, int]:
        for step in reversed(self._maps):
            start, end = step.position(start, False), step.position(end, True)
        return start, end


def _utf8(data: bytes) -> list[tuple[str, int, int]]:
    """(character, first byte, bytes used) for the bytes of a run of byte escapes; a byte that does not start a
    valid UTF-8 sequence gets "" (its escape is kept as written)."""
    out: list[tuple[str, int, int]] = []
    at = 0
    while at < len(data):
        lead = data[at]
        size = 1 if lead < 0x80 else 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else 4 if lead >> 3 == 30 else 0
        if size:
            try:
                out.append((data[at : at + size].decode("utf-8"), at, size))
                at += size
                continue
            except UnicodeDecodeError:
                pass
        out.append(("", at, 1))  # not UTF-8: kept as written
        at += 1
    return out


def _one_round(text: str) -> tuple[str, _Map, set[str]] | None:
    """Decode every escape of one level; None when there was none."""
    # Three substring scans (memchr) say which patterns can match at all; text with none of them costs no more.
    entities, percents, backslashes = "&" in text, "%" in text, "\\" in text
    if not (entities or percents or backslashes):
        return None
    found: list[tuple[int, int, str, str, int]] = []  # (start, end, decoded, kind, step) in the text

    def add(start: int, end: int, decoded: str, kind: str, step: int = 0) -> None:
        found.append((start, end, decoded, kind, step))

    for match in _ENTITY.finditer(text) if entities else ():
        hex_digits, digits, name = match.groups()
        if name is not None:
            if not match.group(0).endswith(";") or name not in _NAMED:
                continue
            add(match.start(), match.end(), _NAMED[name], "html")
            continue
        code = int(hex_digits, 16) if hex_digits is not None else int(digits)
        if code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF:
            add(match.start(), match.end(), chr(code), "html")
    runs = [*(_BYTES[0].finditer(text) if percents else ()), *(_BYTES[1].finditer(text) if backslashes else ())]
    for match in runs:
        escaped = match.group(0)
        width = 3 if escaped.startswith("%") else 4
        kind = "percent" if width == 3 else "backslash"
        if len(escaped) == width and escaped[-2] < "8":  # one ASCII byte (`%20`), the commonest run by far
            add(match.start(), match.end(), chr(int(escaped[-2:], 16)), kind)
            continue
        data = bytes.fromhex("".join(escaped[i + width - 2 : i + width] for i in range(0, len(escaped), width)))
        if data.isascii():  # one character per escape: the run is one piece
            add(match.start(), match.end(), data.decode("ascii"), kind, width)
            continue
        for char, first, used in _utf8(data):
            if char:
                start = match.start() + first * width
                add(start, start + used * width, char, kind)
    matches = list(_UNICODE.finditer(text)) if backslashes else []
    for i, match in enumerate(matches):
        braced, long, short = match.groups()
        code = int(braced or long or short, 16)
        if 0xD800 <= code <= 0xDBFF and short is not None:  # a high surrogate: needs its low half right after
            after = matches[i + 1] if i + 1 < len(matches) else None
            if after is not None and after.start() == match.end() and after.group(3) is not None:
                low = int(after.group(3), 16)
                if 0xDC00 <= low <= 0xDFFF:
                    add(match.start(), after.end(), chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)),
                        "backslash")
            continue
        if 0xDC00 <= code <= 0xDFFF and short is not None:
            continue  # a low half: taken with its high half above, or kept
        if code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF:
            add(match.start(), match.end(), chr(code), "backslash")
    for match in _SIMPLE_RE.finditer(text) if backslashes else ():
        add(match.start(), match.end(), _CONTROL.get(match.group(1), match.group(1)), "backslash")
    if not found:
        return None
    found.sort()
    parts: list[str] = []
    pieces: list[_Piece] = []
    kinds: set[str] = set()
    at = copied = length = 0
    for start, end, decoded, kind, step in found:
        if start < at:
            continue  # overlaps an escape already taken (`\\u0041` also looks like `\\` + `u0041`)
        parts.append(text[copied:start])
        length += start - copied
        pieces.append(_Piece(length, len(decoded), start, end - start, step))
        parts.append(decoded)
        length += len(decoded)
        kinds.add(kind)
        at = copied = end
    parts.append(text[copied:])
    return "".join(parts), _Map(pieces), kinds


def unescape(text: str) -> Unescaped | None:
    """The text with its escapes decoded (up to MAX_ROUNDS levels deep); None when it holds none."""
    maps: list[_Map] = []
    kinds: set[str] = set()
    for _ in range(MAX_ROUNDS):
        decoded = _one_round(text)
        if decoded is None:
            break
        text, step, found = decoded
        maps.append(step)
        kinds |= found
    return Unescaped(text, tuple(sorted(kinds)), tuple(maps)) if maps else None
