"""A media canary: a text drawn in a fixed layout on a fixed canvas, and the reader that gets it back.

The text is drawn in the 5x7 font at three pixels a font pixel, black on white, up to three lines of 22
characters, each line broken after a hyphen where one fits (a canary's lines join back into it).  Every card is
448 x 112 pixels, so two cards take the same processing in any vision model (the same number of image tokens:
an engine served one card's cached features for another's placeholders does not crash on a length mismatch,
vLLM #55546), and both sides are multiples of 14, 16 and 28 (patch sizes of common vision towers).  The bottom row
is left out of the layout: the collision search writes its nonce there.

`read` is the reference engine's stand-in for a vision encoder: it reads the cells where the layout puts them and
takes a cell whose ink is exactly a glyph as that character; a line ends at a blank or unreadable cell.  An image
that is not a card in this layout reads as nothing (None), as a real model sees no code in noise.
"""

from __future__ import annotations

from prober.media.font import BY_INK, GLYPH_H, GLYPH_W, GLYPHS
from prober.media.png import Bitmap

WIDTH, HEIGHT = 448, 112
SCALE = 3  # image pixels per font pixel
CELL_W, CELL_H = (GLYPH_W + 1) * SCALE, (GLYPH_H + 1) * SCALE
LEFT, TOP, PITCH = 16, 12, CELL_H + 8  # where the first cell starts; from one line's top to the next
COLUMNS, LINES = 22, 3
INK, PAPER = 0, 255


def lines_of(text: str) -> list[str]:
    """The text cut into lines of up to COLUMNS characters, after a hyphen where one falls in a line (raises
    ValueError for text that does not fit or has a character the font lacks)."""
    missing = "".join(sorted(set(text) - set(GLYPHS)))
    if missing or not text:
        raise ValueError(f"a card draws {''.join(sorted(GLYPHS))} only, not {missing or text!r}")
    lines = []
    while text:
        cut = len(text) if len(text) <= COLUMNS else (text.rfind("-", 0, COLUMNS) + 1 or COLUMNS)
        lines.append(text[:cut])
        text = text[cut:]
    if len(lines) > LINES:
        raise ValueError(f"{len(lines)} lines: a card holds {LINES} of {COLUMNS} characters")
    return lines


def draw(text: str) -> Bitmap:
    """The card of a text: its characters in the layout's cells, black on white."""
    pixels = bytearray([PAPER]) * (WIDTH * HEIGHT)
    for line, chars in enumerate(lines_of(text)):
        for column, char in enumerate(chars):
            x0, y0 = LEFT + column * CELL_W, TOP + line * PITCH
            for r, bits in enumerate(GLYPHS[char]):
                for c, bit in enumerate(bits):
                    if bit == "1":
                        for y in range(y0 + r * SCALE, y0 + (r + 1) * SCALE):
                            start = y * WIDTH + x0 + c * SCALE
                            pixels[start:start + SCALE] = bytes([INK]) * SCALE
    return Bitmap(WIDTH, HEIGHT, bytes(pixels))


def read(image: Bitmap) -> str | None:
    """The text in the layout's cells (None: not one legible character)."""
    text = []
    for line in range(LINES):
        y0 = TOP + line * PITCH
        if y0 + CELL_H > image.height:
            break
        for column in range(COLUMNS):
            x0 = LEFT + column * CELL_W
            if x0 + CELL_W > image.width:
                break
            ink = "".join("1" if image.at(x0 + c * SCALE + SCALE // 2, y0 + r * SCALE + SCALE // 2) < 128 else "0"
                          for r in range(GLYPH_H) for c in range(GLYPH_W))
            char = BY_INK.get(ink)
            if char is None:
                break
            text.append(char)
    return "".join(text) or None


def reshaped(image: Bitmap) -> Bitmap:
    """The same pixel bytes read with width and height swapped (448 x 112 becomes 112 x 448): another image to
    the eye and to any reader, the same buffer to a hash that leaves the shape out."""
    return Bitmap(image.height, image.width, image.data)
