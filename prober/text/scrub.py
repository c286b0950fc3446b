"""One scrubber for every secret leakprobe knows: tenant API keys, the canary key, database passwords.

A target may be hostile or merely careless: a debug gateway echoes the request's `Authorization` header
into its error bodies or answers, and not always as sent — base64 of `Bearer KEY` (or of `user:KEY`, inside
a longer base64 string), hex, `%XX`, upper case, reversed, spaced out, as HTML entities or `\\u` escapes.
Whatever the target sends is scrubbed where it enters (the transport), and every exit (log lines, reports,
the ledger, `/status`) scrubs again, so no secret reaches a file or a screen.  A secret is *replaced* by a
label naming whose it was, never masked to its shape.

How a form is recognised (the rule the tests check): escapes are decoded first, as detection decodes them
(`prober/text/escapes.py`: `%XX` runs as UTF-8, HTML references, `\\u` and `\\x` escapes, a backslash before
punctuation, up to three levels deep), and where that changed anything the text is read as
written too (an escape-shaped run may be plain text: `%00` right before a key that begins `00…`); then
each reading is *folded*: separators deleted (whitespace, `- _ . , : ; | / + * ~`, middle dots, dashes,
soft hyphens, zero-width characters) and ASCII letters lowered.  The folded text is searched for the
folded secret, its reversal, the hex of its UTF-8 bytes, its base64, and for each of the three byte
alignments the base64 characters that depend on the secret alone — so a key anywhere inside a longer base64
or base64url string (`Bearer KEY`, `user:KEY`) is found, and the match swallows the neighbouring characters
that carry the secret's first and last bits.

Speed: text is searched in windows (8 KiB, plus an overlap longer than any form of the longest secret with
up to MAX_SEPARATORS separators between its characters), each decoded, folded and searched by one
Aho-Corasick automaton in C; only a window with a hit is mapped back character by character.
`bench/scrub.py` measures the cost.
"""

from __future__ import annotations

import base64
import logging
import re
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import ahocorasick

from prober.text.escapes import Unescaped, unescape

MIN_SECRET = 4  # shorter "secrets" would scrub ordinary text; the config refuses them
STEP = 8_192  # characters (or bytes) a window advances
MAX_SEPARATORS = 8  # separators between two characters that are always within one window
MAX_ESCAPE = 12  # the longest escape of one character (`&#x0000e9;`, `%E2%80%8B`)
MIN_BASE64 = 6  # base64 characters: 36 bits of a secret, never a common word

# Separators a server may put between a secret's characters, and that the folded text drops.
ASCII_SEPARATORS = " \t\r\n\v\f-_.,:;|/+*~"
WIDE_SEPARATORS = "\u00a0\u00ad\u00b7\u2022\u2010\u2011\u2012\u2013\u2014\u200b\u200c\u200d\u2060\ufeff"
SEPARATORS = frozenset(ASCII_SEPARATORS + WIDE_SEPARATORS)
B64_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_")

_LOWER = bytes(range(256)).translate(bytes.maketrans(bytes(range(65, 91)), bytes(range(97, 123))))
_ASCII_SEPS = ASCII_SEPARATORS.encode()
_WIDE_SEPS = re.compile(b"|".join(re.escape(c.encode()) for c in WIDE_SEPARATORS))

_WORD = re.compile("[^" + re.escape(ASCII_SEPARATORS + WIDE_SEPARATORS) + "]+")


def fold(text: str) -> str:
    """Separators deleted, ASCII lower case: the form every case- and spacing-variant of a secret shares."""
    return "".join(c.lower() if c.isascii() else c for c in text if c not in SEPARATORS)


def base64_forms(secret: bytes) -> set[str]:
    """The secret's base64, and for each byte alignment the base64 characters that depend on `secret` alone:
    what any base64 (or base64url) string holding the secret at an offset of that alignment contains."""
    forms = {base64.b64encode(secret).decode().rstrip("=")}
    for align, lead in ((0, 0), (1, 2), (2, 3)):
        encoded = base64.b64encode(b"\0" * align + secret).decode()
        forms.add(encoded[lead : (8 * (align + len(secret))) // 6])
    return {f for f in forms if len(f) >= MIN_BASE64}


@dataclass(frozen=True)
class SecretForms:
    """The folded forms of one secret: its text, its reversal, its hex, its base64 at every alignment.  Folded
    like the text they are searched in, base64 forms turn case-blind (and base64url the same as base64): a
    little more is masked, never less."""

    text: frozenset[str]
    base64: frozenset[str]

    @classmethod
    def of(cls, secret: str) -> SecretForms:
        raw = secret.encode("utf-8", "surrogatepass")
        text = {fold(secret), fold(secret[::-1]), raw.hex()}
        return cls(frozenset(f for f in text if len(f) >= MIN_SECRET),
                   frozenset(fold(f) for f in base64_forms(raw)) - text)

    @property
    def longest(self) -> int:
        return max(map(len, self.text | self.base64), default=0)


Hit = tuple[int, int, str]  # start, end, label
_Text = TypeVar("_Text", str, bytes)
_Data = str | bytes | bytearray  # what `_hits` walks (named here: inside Scrubber, `bytes` is a method)


class _Automata:
    """Every folded form of every secret in one Aho-Corasick automaton, twice: over characters (the mapped
    search of a window with a hit) and over UTF-8 bytes read as latin-1 (the fast search of every window)."""

    def __init__(self, forms: Mapping[str, SecretForms]) -> None:
        def build(as_bytes: bool) -> ahocorasick.Automaton:
            automaton = ahocorasick.Automaton()
            for label, secret in forms.items():
                for kind, found in ((False, secret.text), (True, secret.base64)):
                    for form in found:
                        key = form.encode("utf-8", "surrogatepass").decode("latin-1") if as_bytes else form
                        automaton.add_word(key, (len(key), label, kind))
            automaton.make_automaton()
            return automaton

        self.fast = build(True)
        self.chars = build(False)


class Scrubber:
    """`secrets` maps a label ("key of tenant-a") to a secret value."""

    def __init__(self, secrets: Mapping[str, str] | None = None) -> None:
        forms = {label: SecretForms.of(value) for label, value in (secrets or {}).items()
                 if len(value) >= MIN_SECRET}
        forms = {label: f for label, f in forms.items() if f.text or f.base64}
        self._automata = _Automata(forms) if forms else None
        longest = max((f.longest for f in forms.values()), default=0)
        # Any form whose characters sit at most MAX_SEPARATORS apart lies wholly inside one window.
        self._overlap = longest * (MAX_ESCAPE + MAX_SEPARATORS) + 16

    def __bool__(self) -> bool:
        return self._automata is not None

    def text(self, value: str) -> str:
        if self._automata is None or not value:
            return value
        hits = list(self._hits(value, lambda start, end: value[start:end]))
        return _replace(value, hits) if hits else value

    def bytes(self, value: bytes | bytearray) -> bytes | bytearray:
        """Raw bytes (a body before it is decoded): searched as UTF-8, undecodable bytes kept as they are."""
        if self._automata is None or not value:
            return value
        hits = list(self._hits(value, lambda a, b: bytes(value[a:b]).decode("utf-8", "surrogateescape")))
        return _replace(bytes(value), hits) if hits else value

    def value(self, obj: Any) -> Any:
        """Strings inside JSON-like data (finding details, /status)."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {self.text(str(k)): self.value(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.value(v) for v in obj]
        return obj

    # -- search ---------------------------------------------------------------------------------------
    def _hits(self, value: _Data, window_of: Callable[[int, int], str]) -> Iterator[Hit]:
        """Hits in `value`'s units (characters of a str, bytes of bytes), window by window."""
        size = len(value)
        start = 0
        while True:
            end = min(size, start + STEP + self._overlap)
            window = window_of(start, end)
            decoded = unescape(window)  # once per window: the fast search and the mapped one read it
            if self._suspect(window, decoded):
                for a, b, label in self._mapped(window, decoded):
                    if isinstance(value, str):
                        yield start + a, start + b, label
                    else:  # characters -> bytes of this window
                        yield (start + len(window[:a].encode("utf-8", "surrogateescape")),
                               start + len(window[:b].encode("utf-8", "surrogateescape")), label)
            if end >= size:
                return
            start += STEP

    def _suspect(self, window: str, decoded: Unescaped | None) -> bool:
        """Whether a window may hold a secret, found with C-speed passes only (translate, search)."""
        assert self._automata is not None
        return any(next(self._automata.fast.iter(_fold_fast(text)), None) is not None
                   for text in ((window,) if decoded is None else (decoded.text, window)))

    def _mapped(self, window: str, decoded: Unescaped | None) -> list[Hit]:
        """Exact spans in a window known to hold a secret, in both readings of its escapes."""
        hits = self._mapped_reading(window, None, window)
        if decoded is not None:
            hits += self._mapped_reading(decoded.text, decoded, window)
        return hits

    def _mapped_reading(self, decoded: str, escapes: Unescaped | None, window: str) -> list[Hit]:
        """Spans in one reading (`escapes` maps it back to the window; None: the window as written), folded word
        by word (a word is a run without separators), so each folded character maps back to where it came
        from without a loop over characters."""
        assert self._automata is not None
        folded: list[str] = []
        words: list[tuple[int, int]] = []  # (start in the folded text, start in the decoded text)
        at = 0
        for word in _WORD.finditer(decoded):
            text = word.group(0)
            folded.append(text.lower() if text.isascii() else "".join(c.lower() if c.isascii() else c for c in text))
            words.append((at, word.start()))
            at += len(text)
        word_starts = [w[0] for w in words]

        def source(index: int) -> tuple[int, int]:
            """The window span that folded character `index` came from."""
            fold_start, dec_start = words[bisect_right(word_starts, index) - 1]
            at = dec_start + index - fold_start
            return escapes.original_span(at, at + 1) if escapes is not None else (at, at + 1)

        hits: list[Hit] = []
        for last, (length, label, is_base64) in self._automata.chars.iter("".join(folded)):
            start, end = source(last - length + 1)[0], source(last)[1]
            if is_base64:
                start, end = _widen_base64(window, start, end)
            hits.append((start, end, label))
        return hits


def _fold_fast(text: str) -> str:
    """`fold` in C-speed passes, as latin-1 of the UTF-8 bytes (what the fast automaton searches)."""
    folded = text.encode("utf-8", "surrogatepass").translate(_LOWER, _ASCII_SEPS)
    if b"\xc2" in folded or b"\xe2" in folded or b"\xef" in folded:
        folded = _WIDE_SEPS.sub(b"", folded)
    return folded.decode("latin-1")


def _widen_base64(text: str, start: int, end: int) -> tuple[int, int]:
    """Take in the character either side that holds some of the secret's bits, and the padding."""
    if start > 0 and text[start - 1] in B64_ALPHABET:
        start -= 1
    if end < len(text) and text[end] in B64_ALPHABET:
        end += 1
    while end < len(text) and text[end] == "=":
        end += 1
    return start, end


def _replace(value: _Text, hits: list[Hit]) -> _Text:
    """`value` with each (merged) hit replaced by its label."""
    hits.sort()
    merged: list[list[Any]] = []
    for start, end, label in hits:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
            if label not in merged[-1][2]:
                merged[-1][2].append(label)
        else:
            merged.append([start, end, [label]])
    pieces = []
    at = 0
    for start, end, labels in merged:
        label = f"[redacted {' and '.join(labels)}]"
        pieces += [value[at:start], label if isinstance(value, str) else label.encode()]
        at = end
    pieces.append(value[at:])
    return value[:0].join(pieces)


class ScrubbingFilter(logging.Filter):
    """Applied to a handler: every record it emits is scrubbed, whichever library logged it."""

    def __init__(self, scrubber: Scrubber) -> None:
        super().__init__()
        self.scrubber = scrubber

    def filter(self, record: logging.LogRecord) -> bool:
        if self.scrubber:
            message = record.getMessage()
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.msg, record.args = self.scrubber.text(message), None
            if record.exc_text:
                record.exc_text = self.scrubber.text(record.exc_text)
        return True
