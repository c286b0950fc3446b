"""The reference engine's own tokenizer: deterministic, stateless, reversible, fast.

Why its own: a prober must *measure* token counts through the engine (tokenize endpoint or usage)
instead of guessing from characters or words, so the engine's counts deliberately differ from both.

Rules (applied left to right by one regular expression, first alternative wins):

1. a space followed by 1-3 ASCII letters           -> one token (" the", " a")
2. 1-4 ASCII letters                                 -> one token ("vault" = "vaul" + "t")
3. 1-3 ASCII digits                                  -> one token ("4471" = "447" + "1")
4. a line break                                      -> one token
5. 1-4 spaces or tabs                                -> one token
6. 1-2 ASCII punctuation characters                  -> one token
7. any other single character (non-ASCII, controls)  -> one token per character

Token ids are int32 and need no vocabulary: an ASCII piece of 1-4 bytes is its bytes read as a
little-endian integer (always positive, below 2**31 because ASCII bytes are < 0x80); any other
character is minus its code point.  Id 0 is the placeholder token that a scheduler substitutes for an
aborted prompt; it decodes to the empty string.  NUL characters are dropped from input text.
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

PLACEHOLDER_TOKEN = 0

_PIECE = re.compile(
    r" [A-Za-z]{1,3}|[A-Za-z]{1,4}|[0-9]{1,3}|\n|[ \t]{1,4}|[!-/:-@\[-`{-~]{1,2}|.",
    re.DOTALL,
)

TokenIds = npt.NDArray[np.int32]


def pieces(text: str) -> list[str]:
    """Split text into token pieces (the strings behind each id)."""
    return _PIECE.findall(text.replace("\x00", ""))


def encode(text: str) -> TokenIds:
    """Text -> int32 token ids."""
    parts = pieces(text)
    if not parts:
        return np.zeros(0, dtype=np.int32)
    if text.isascii():
        # Fast path: numpy packs each piece into 4 NUL-padded bytes, read as little-endian int32.
        return np.array(parts, dtype="S4").view("<i4").copy()
    ids = np.empty(len(parts), dtype=np.int32)
    for i, piece in enumerate(parts):
        ids[i] = int.from_bytes(piece.encode("ascii"), "little") if piece.isascii() else -ord(piece)
    return ids


def count(text: str) -> int:
    """Number of tokens in text (without building the id array)."""
    return len(pieces(text))


def decode(ids: TokenIds) -> str:
    """int32 token ids -> text.  Placeholder ids decode to nothing."""
    ids = np.asarray(ids, dtype=np.int32)
    if ids.size == 0:
        return ""
    if bool((ids >= 0).all()):
        return ids.astype("<i4").tobytes().replace(b"\x00", b"").decode("ascii")
    out: list[str] = []
    for value in ids.tolist():
        if value > 0:
            out.append(value.to_bytes(4, "little").rstrip(b"\x00").decode("ascii"))
        elif value < 0:
            out.append(chr(-value))
    return "".join(out)
