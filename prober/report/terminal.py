"""Text that is read as often through a pipe or a CI log as on a screen.

On a terminal: tables that fit its width and wrap long cells (never cut them), colour unless `NO_COLOR` is
set.  Anywhere else (a pipe, a file, a CI log): plain aligned columns as wide as their widest cell, nothing
cut, no colour, no escape codes.
"""

from __future__ import annotations

import io
import os
import shutil
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.table import Table


@dataclass(frozen=True)
class Terminal:
    tty: bool = False
    color: bool = False
    width: int = 100

    @classmethod
    def of(cls, stream: TextIO) -> Terminal:
        tty = stream.isatty()
        return cls(tty=tty, color=tty and not os.environ.get("NO_COLOR"),
                   width=shutil.get_terminal_size().columns if tty else 100)

    def table(self, header: list[str], rows: list[list[str]], title: str = "") -> str:
        if not self.tty:
            return plain_table(header, rows, title)
        table = Table(*header, title=title or None, title_justify="left")
        for column in table.columns:
            column.overflow = "fold"
        for row in rows:
            table.add_row(*row)
        return self.render(table)

    def render(self, renderable: object) -> str:
        out = io.StringIO()
        Console(file=out, width=self.width, highlight=False, force_terminal=self.tty, no_color=not self.color,
                color_system="standard" if self.color else None).print(renderable)
        return out.getvalue()

    def style(self, text: str, style: str) -> str:
        """`text` in a rich style (bold, red) on a colour terminal; as it is elsewhere."""
        if not self.color:
            return text
        return self.render(f"[{style}]{_markup_escape(text)}[/]").rstrip("\n")


def plain_table(header: list[str], rows: list[list[str]], title: str = "") -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [f"{title}:"] if title else []
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines) + "\n"


def _markup_escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
