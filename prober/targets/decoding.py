"""Content-Encoding decoded a bounded step at a time, so the body's byte cap holds on decoded bytes.

A decoder that inflates a whole network chunk at once lets 6.8 KB of `gzip, gzip` become gigabytes before
any cap is checked.  Here each call to zlib yields at most STEP bytes, and the caller counts them as they
come out.  At most one coding is decoded: a stack of them (`gzip, gzip`) is what a bomb looks like and what
no engine sends, so it is refused before a byte is read.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

STEP = 64 * 1024  # decoded bytes per zlib call: the most a body grows before the cap is checked again
ACCEPTED = "gzip, deflate"  # what the client offers: exactly what it can decode
_CODINGS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}


class DecodingError(ValueError):
    """A body that cannot be decoded: an unknown or stacked coding, or corrupt compressed data."""


def codings(header: str | None) -> list[str]:
    """The codings a Content-Encoding header lists, in the order they were applied, identity left out."""
    return [c for c in (part.strip().lower() for part in (header or "").split(",")) if c and c != "identity"]


class BoundedDecoder:
    """Feed raw body bytes; get decoded bytes back in pieces of at most STEP bytes."""

    def __init__(self, header: str | None) -> None:
        applied = codings(header)
        if len(applied) > 1:
            raise DecodingError(f"stacked content encodings ({', '.join(applied)}) refused: at most one is decoded")
        if applied and applied[0] not in _CODINGS:
            raise DecodingError(f"unsupported content encoding {applied[0]!r} (offered: {ACCEPTED})")
        self.coding = applied[0] if applied else ""
        self._zlib = zlib.decompressobj(_CODINGS[self.coding]) if self.coding else None
        self._raw_deflate_tried = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._zlib is None:
            for at in range(0, len(data), STEP):
                yield data[at : at + STEP]
            return
        while data:
            try:
                out = self._zlib.decompress(data, STEP)
            except zlib.error as exc:
                if self.coding == "deflate" and not self._raw_deflate_tried:
                    # Servers disagree on "deflate": zlib-wrapped (the RFC) or raw; try raw once.
                    self._raw_deflate_tried = True
                    self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
                    continue
                raise DecodingError(f"corrupt {self.coding} data: {exc}") from None
            self._raw_deflate_tried = True
            if out:
                yield out
            data = self._zlib.unconsumed_tail
            if self._zlib.eof:
                # A gzip body may hold several members, one after another.
                data = self._zlib.unused_data + data
                if not data or self.coding == "deflate":
                    return
                self._zlib = zlib.decompressobj(_CODINGS[self.coding])

    def flush(self) -> Iterator[bytes]:
        """What zlib still holds once the body has ended (nothing more is read into it)."""
        if self._zlib is None:
            return
        while True:
            out = self._zlib.decompress(b"", STEP)
            if not out:
                return
            yield out
