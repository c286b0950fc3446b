"""8-bit grayscale images and the PNG files they travel in, written and read with zlib alone.

The writer makes what media canaries need (one channel, no filter).  The reader is the reference engine's, so it
takes what a client may send — 8-bit grayscale, grey with alpha, RGB or RGBA, any of the five row filters, no
interlacing — and refuses the rest, or a file that is truncated, corrupt or would inflate past `MAX_PIXELS`,
with a `PNGError` that says why.
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from dataclasses import dataclass

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_PIXELS = 512 * 512  # past it a file is refused before it is inflated: its Paeth rows would take seconds
DATA_URL_PREFIX = "data:image/png;base64,"
CHANNELS = {0: 1, 4: 2, 2: 3, 6: 4}  # colour type -> samples per pixel (grey, grey+alpha, RGB, RGBA)


class PNGError(ValueError):
    """A file the reader cannot take: the message says what is wrong with it."""


@dataclass(frozen=True)
class Bitmap:
    """Grey levels, one byte per pixel, row by row (0 black, 255 white)."""

    width: int
    height: int
    data: bytes

    def __post_init__(self) -> None:
        if self.width < 1 or self.height < 1 or len(self.data) != self.width * self.height:
            raise ValueError(f"{self.width}x{self.height} needs {self.width * self.height} bytes, got {len(self.data)}")

    def at(self, x: int, y: int) -> int:
        return self.data[y * self.width + x]


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def encode(bitmap: Bitmap) -> bytes:
    """A grayscale PNG of the bitmap (filter 0 on every row)."""
    w = bitmap.width
    raw = b"".join(b"\0" + bitmap.data[y * w:(y + 1) * w] for y in range(bitmap.height))
    header = struct.pack(">IIBBBBB", w, bitmap.height, 8, 0, 0, 0, 0)
    return SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")


def data_url(bitmap: Bitmap) -> str:
    return DATA_URL_PREFIX + base64.b64encode(encode(bitmap)).decode("ascii")


def from_data_url(url: str) -> Bitmap:
    """A `data:image/png;base64,…` URL's image (raises PNGError for any other URL or a bad file)."""
    if not url.startswith(DATA_URL_PREFIX):
        raise PNGError("only data:image/png;base64 URLs are read")
    try:
        return decode(base64.b64decode(url[len(DATA_URL_PREFIX):], validate=True))
    except binascii.Error as exc:
        raise PNGError(f"the data URL is not base64: {exc}") from None


def decode(data: bytes) -> Bitmap:
    """The file's pixels as grey levels (colour as luminance, alpha ignored)."""
    if not data.startswith(SIGNATURE):
        raise PNGError("not a PNG file")
    header, idat = _chunks(data)
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", header)
    if depth != 8 or colour not in CHANNELS or compression or filtering or interlace:
        raise PNGError(f"only 8-bit grey, grey+alpha, RGB or RGBA without interlacing is read (bit depth {depth}, "
                       f"colour type {colour}, interlace {interlace})")
    if not width or not height or width * height > MAX_PIXELS:
        raise PNGError(f"{width}x{height} pixels: more than {MAX_PIXELS:,} or none")
    channels = CHANNELS[colour]
    stride = width * channels
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(idat, height * (stride + 1) + 1)
    except zlib.error as exc:
        raise PNGError(f"the image data does not inflate: {exc}") from None
    size = height * (stride + 1)
    if len(raw) != size:
        raise PNGError(f"the image data inflates {'past' if len(raw) > size else f'to {len(raw):,} bytes, not'} the "
                       f"{size:,} bytes a {width}x{height} image has")
    rows = _unfiltered(raw, height, stride, channels)
    return Bitmap(width, height, _grey(rows, channels))


def _chunks(data: bytes) -> tuple[bytes, bytes]:
    """IHDR's body and the IDAT chunks' bodies joined, each chunk's CRC checked."""
    at, header, idat = len(SIGNATURE), None, []
    while at + 12 <= len(data):
        (size,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + size]
        if len(body) != size or at + 12 + size > len(data):
            raise PNGError(f"chunk {kind!r} is cut short")
        (crc,) = struct.unpack(">I", data[at + 8 + size:at + 12 + size])
        if zlib.crc32(kind + body) != crc:
            raise PNGError(f"chunk {kind!r} fails its CRC")
        if kind == b"IHDR" and len(body) == 13:
            header = body
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        at += 12 + size
    if header is None or not idat:
        raise PNGError("no IHDR or no IDAT chunk")
    return header, b"".join(idat)


def _unfiltered(raw: bytes, height: int, stride: int, bpp: int) -> bytes:
    """The rows with PNG's five filters undone: None, Sub and Up at numpy's speed, Average and Paeth (whose every
    byte waits on the one to its left) byte by byte, about a microsecond and a half each here."""
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(height, stride + 1)
    out = np.empty((height, stride), dtype=np.uint8)
    prior = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        kind, row = int(rows[y, 0]), rows[y, 1:]
        if kind == 0:
            out[y] = row
        elif kind == 1:
            out[y] = row.reshape(-1, bpp).cumsum(axis=0, dtype=np.uint8).reshape(-1)  # wraps modulo 256
        elif kind == 2:
            out[y] = row + prior  # uint8: modulo 256
        elif kind in (3, 4):
            out[y] = _sequential(bytearray(row.tobytes()), prior.tobytes(), bpp, kind)
        else:
            raise PNGError(f"row {y} has filter type {kind}")
        prior = out[y]
    return out.tobytes()


def _sequential(row: bytearray, prior: bytes, bpp: int, kind: int) -> bytearray:
    for i in range(len(row)):
        left = row[i - bpp] if i >= bpp else 0
        up, corner = prior[i], prior[i - bpp] if i >= bpp else 0
        row[i] = (row[i] + ((left + up) // 2 if kind == 3 else _paeth(left, up, corner))) & 0xFF
    return row


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def _grey(pixels: bytes, channels: int) -> bytes:
    """Grey levels: grey as it is, colour as its luminance (ITU-R 601), alpha dropped."""
    samples = np.frombuffer(pixels, dtype=np.uint8).reshape(-1, channels)
    if channels <= 2:
        return samples[:, 0].tobytes()
    r, g, b = (samples[:, i].astype(np.uint32) for i in range(3))
    return ((299 * r + 587 * g + 114 * b) // 1000).astype(np.uint8).tobytes()
