"""Plain-text and GitHub Markdown tables of string cells.

The same bytes as ``tabulate(rows, headers, tablefmt="simple" | "github", disable_numparse=True)`` for the
cells the renderers make, without importing tabulate on the way to the first line of output: tabulate 0.10
imports ``wcwidth`` and ``importlib.metadata`` (a third of a small alignment's import time).
``tests/render/test_grid.py`` checks the equality against tabulate itself.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

_MIN_PADDING = 2  # tabulate's room around a header


def grid(rows: Sequence[Sequence[object]], headers: Sequence[str], *, markdown: bool = False,
         align: Sequence[str] | None = None) -> str:
    """``rows`` under ``headers``; ``align`` gives ``"left"`` (the default) or ``"right"`` per column.

    Cells are shown as ``str(cell)`` (``None`` as empty) with surrounding whitespace stripped; a line break
    inside a cell is shown as ``\\n``, so every row is one line.
    """
    columns = len(headers)
    cells = [[_cell(row[i]) if i < len(row) else "" for i in range(columns)] for row in rows]
    head = [_cell(h, strip=False) for h in headers]
    sides = list(align) if align is not None and rows else ["left"] * columns  # tabulate: no rows, no alignment
    widths = [max([_width(head[i]) + _MIN_PADDING] + [_width(r[i]) for r in cells]) for i in range(columns)]
    if markdown:
        return "\n".join(_markdown_lines(head, cells, widths, sides))
    lines = [_line(head, widths, sides), "  ".join("-" * w for w in widths)]
    lines += [_line(r, widths, sides) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _markdown_lines(head: list[str], cells: list[list[str]], widths: list[int], sides: list[str]) -> list[str]:
    def row(values: list[str]) -> str:
        return "| " + " | ".join(_pad(v, w, s) for v, w, s in zip(values, widths, sides)) + " |"
    return [row(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [row(r) for r in cells]


def _line(values: list[str], widths: list[int], sides: list[str]) -> str:
    return "  ".join(_pad(v, w, s) for v, w, s in zip(values, widths, sides))


def _pad(value: str, width: int, side: str) -> str:
    room = " " * (width - _width(value))
    return room + value if side == "right" else value + room


def _cell(value: object, *, strip: bool = True) -> str:
    text = "" if value is None else str(value)
    text = text.strip() if strip else text  # tabulate strips cells, not headers
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _width(text: str) -> int:
    """Columns a terminal gives ``text``: two for East Asian wide characters, none for combining marks."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
               for c in text)
