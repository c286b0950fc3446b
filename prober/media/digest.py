"""The reference media digest, what cutting it short or leaving the shape out does, and a bounded search for an
image whose cut digest equals another's.

Engines key processed media (an image's features) by a digest of it.  A sound digest covers the pixels and the
shape; the faults the media-cache check looks for cut it to a few bits (LMCache's 16-bit `hex_hash_to_int16`,
#3301 and #4086) or leave the shape out (Dynamo PR #8340).  The reference engine keys its media cache with
`digest`; the check finds a card of its own whose digest agrees with another tenant's in the low `bits` bits by
writing a nonce into the card's bottom row, which the digest covers last, so each try hashes one row.
"""

from __future__ import annotations

import hashlib
import time
from itertools import count

from prober.media.png import Bitmap

PERSON = b"lp-media"  # the digest's own domain: no other blake2b in the project shares its values
NONCE_BYTES = 8
CHECK_EVERY = 4096  # tries between looks at the clock


def _hasher(width: int, height: int, shape: bool) -> hashlib.blake2b:
    hasher = hashlib.blake2b(digest_size=32, person=PERSON)
    if shape:
        hasher.update(f"{width}x{height}:L\0".encode())
    return hasher


def digest(image: Bitmap, *, shape: bool = True) -> bytes:
    """blake2b of the grey levels, after the width and height unless `shape` is False (the fault)."""
    hasher = _hasher(image.width, image.height, shape)
    hasher.update(image.data)
    return hasher.digest()


def cut(value: bytes, bits: int) -> int:
    """The low `bits` bits of a digest (as LMCache keeps the last four hex digits of one)."""
    return int.from_bytes(value, "big") & ((1 << bits) - 1)


def colliding(image: Bitmap, wanted: int, bits: int, seconds: float) -> Bitmap | None:
    """The image with a nonce in its bottom row such that `cut(digest(result), bits) == wanted`, or None when none
    turned up within `seconds` (2**bits tries are expected: 65,536 for 16 bits, well under a second)."""
    w = image.width
    if w < NONCE_BYTES:
        raise ValueError(f"a {w}-pixel row holds no {NONCE_BYTES}-byte nonce")
    head = _hasher(w, image.height, True)
    head.update(image.data[:-w])
    tail = image.data[-w + NONCE_BYTES:]
    give_up = time.monotonic() + seconds
    for n in count():
        row = n.to_bytes(NONCE_BYTES, "little") + tail
        hasher = head.copy()
        hasher.update(row)
        if cut(hasher.digest(), bits) == wanted:
            return Bitmap(w, image.height, image.data[:-w] + row)
        if n % CHECK_EVERY == 0 and time.monotonic() > give_up:
            return None
    raise AssertionError("unreachable")
