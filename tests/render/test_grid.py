"""The console and Markdown tables are tabulate's "simple" and "github" formats, byte for byte.

``render/grid.py`` writes them without importing tabulate (whose import is a third of a small
alignment's start-up); tabulate stays the oracle here, over cells like the renderers' and some that are not.
"""

from __future__ import annotations

import random

import pytest
from tabulate import tabulate

from tracediff.render.grid import grid

_WORDS = ["", " ", "a", "model.layers.0.self_attn.q_proj", "outputs.0", "1.19e-07", "-2", "[1, 6, 64]",
          "float32", ">>", "S", "ok", "DIVERGED", "  padded  ", "é", "naïve", "中文", "模块.线性", "x\u0301"]


def _cells(rng: random.Random, rows: int, columns: int) -> list[list[str]]:
    return [[rng.choice(_WORDS) for _ in range(columns)] for _ in range(rows)]


@pytest.mark.parametrize("seed", range(40))
def test_simple_and_github_tables_are_tabulates(seed: int) -> None:
    rng = random.Random(seed)
    columns = rng.randint(1, 6)
    rows = _cells(rng, rng.randint(0, 7), columns)
    headers = [rng.choice(_WORDS) for _ in range(columns)]
    assert grid(rows, headers) == tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)
    if rows:  # the renderers print no Markdown table without rows
        assert grid(rows, headers, markdown=True) == tabulate(rows, headers=headers, tablefmt="github",
                                                               disable_numparse=True)
    align = [rng.choice(["left", "right"]) for _ in range(columns)]
    assert grid(rows, headers, align=align) == tabulate(rows, headers=headers, tablefmt="simple",
                                                        disable_numparse=True, colalign=align)


def test_a_line_break_in_a_cell_stays_on_its_row() -> None:
    table = grid([["layer\x0a0", "x"]], ["module", "v"])
    assert table.splitlines()[2] == "layer\\n0  x"
