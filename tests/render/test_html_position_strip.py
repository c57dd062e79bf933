"""The HTML report's per-position strip: the first diverging tensor's error at each token position."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
import torch

import tracediff
from tests.generation import ports
from tracediff.alignment.result import Alignment
from tracediff.compare.positions import position_error_ratios, positions_beyond_tolerance
from tracediff.render.html import render_html

_CELL = re.compile(r'<span class="cell ([a-z0-9]+)( first-bad)?" title="([^"]*)"></span>')
_STRIP = re.compile(r'<div class="strip" id="position-strip">.*?</div></div>', re.S)


@pytest.fixture(scope="module")
def window_bug(tmp_path_factory: pytest.TempPathFactory) -> Alignment:
    """A Mistral whose sliding window (8) reaches one position further, on a 12-token prompt: positions 8-11."""
    root = tmp_path_factory.mktemp("strip")
    ids = torch.randint(0, ports.VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    for name, model in (("ref", ports.mistral()), ("port", ports.sliding_window_late())):
        with torch.no_grad(), tracediff.capture(model, root / name):
            model(ids)
    return tracediff.align(root / "ref", root / "port")


def test_the_strip_has_a_cell_per_position_coloured_by_error_over_tolerance(window_bug: Alignment) -> None:
    first = window_bug.first_divergence
    strip = window_bug.position_strip
    assert first is not None and strip is not None and strip.order == first.order
    assert (strip.start, len(strip.ratios), strip.first) == (0, 12, ports.WINDOW) == (0, 12, first.position)
    (block,) = _STRIP.findall(render_html(window_bug))
    cells = _CELL.findall(block)
    assert len(cells) == 12
    assert [level for level, _, _ in cells[:ports.WINDOW]] == ["exact"] * ports.WINDOW
    assert all(level == "sev3" for level, _, _ in cells[ports.WINDOW:])  # a mask: far beyond tolerance
    assert [i for i, (_, marked, _) in enumerate(cells) if marked] == [ports.WINDOW]  # the first bad one only
    assert cells[ports.WINDOW][2].startswith(f"position {ports.WINDOW}: ")
    assert "error per position 0&ndash;11 (first out of tolerance: position 8)" in block


def test_the_ratios_follow_the_pass_rule() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(1, 10, 4)).astype(np.float32)
    b = a.copy()
    b[0, 7, 2] += 1e-3
    b[0, 3, 1] += 1e-7  # within tolerance
    b[0, 9, :] = np.nan
    ratios = position_error_ratios(a, b, atol=1e-5, rtol=1e-5, dim=1)
    expected = np.zeros(10)
    for i in (3, 7):
        d = np.abs(a[0, i].astype(np.float64) - b[0, i])
        expected[i] = (d / (1e-5 + 1e-5 * np.abs(a[0, i].astype(np.float64)))).max()
    expected[9] = np.inf
    assert np.allclose(ratios, expected, rtol=1e-12)
    found = positions_beyond_tolerance(a, b, atol=1e-5, rtol=1e-5, dim=1)
    assert list(np.flatnonzero(ratios > 1)) == [7, 9] and (found.first, found.count) == (7, 2)


def test_many_positions_share_cells_by_their_worst(window_bug: Alignment) -> None:
    strip = window_bug.position_strip
    assert strip is not None
    long = replace(window_bug, position_strip=replace(strip, ratios=(0.5,) * 600 + (3.0,) + (0.5,) * 399))
    (block,) = _STRIP.findall(render_html(long))
    cells = _CELL.findall(block)
    assert len(cells) == 250  # 1000 positions, 4 to a cell
    assert [i for i, (_, marked, _) in enumerate(cells) if marked] == [150]
    assert cells[150] == ("sev1", " first-bad", "positions 600-603: 3 &times; tolerance")


def test_the_strip_is_escaped_and_loads_nothing(window_bug: Alignment) -> None:
    page = render_html(window_bug)
    (block,) = _STRIP.findall(page)
    assert "http" not in block and "<script" not in block and "style=" not in block
    assert re.findall(r"https?://[^\s\"'<>]+", page) == ["http://www.w3.org/2000/svg"]


def test_no_strip_without_a_divergence(window_bug: Alignment) -> None:
    same = tracediff.align(window_bug.trace_a, window_bug.trace_a)
    assert same.passed and same.position_strip is None
    assert "position-strip" not in render_html(same)
