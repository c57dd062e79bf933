"""``tracediff plot`` / ``plot_alignment``: the error-growth image, and a clear error without matplotlib."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from tracediff.alignment.result import Alignment
from tracediff.cli.main import main
from tracediff.demo import DemoResult
from tracediff.errors import UsageError
from tracediff.render.plot import error_figure, plot_alignment

pytest.importorskip("matplotlib")


def test_figure_draws_each_row_error_with_zeros_on_the_floor(demo_alignment: Alignment) -> None:
    fig = error_figure(demo_alignment)
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    rows = demo_alignment.rows
    abs_line = lines["max abs error"]
    assert list(abs_line.get_xdata()) == [r.order for r in rows]
    floor = min(abs_line.get_ydata())
    for y, row in zip(abs_line.get_ydata(), rows):
        assert y == (floor if row.max_abs_err == 0 else pytest.approx(row.max_abs_err))
    assert floor < min(r.max_abs_err for r in rows if r.max_abs_err > 0) / 5
    assert [t.get_text() for t in ax.get_yticklabels()][0] == "0"
    assert list(lines["atol"].get_ydata()) == [r.atol if r.atol > 0 else floor for r in rows]
    first = demo_alignment.first_divergence
    assert first is not None
    marker = [line for line in ax.get_lines() if list(line.get_xdata()) == [first.order, first.order]]
    assert marker, "no vertical line at the first divergence"
    assert any(text.get_text() == f"first divergence: {first.module_path_b} {first.tensor}" for text in ax.texts)
    red = ax.collections[0].get_offsets()
    assert [int(x) for x, _ in red] == [r.order for r in demo_alignment.diverged]
    assert ax.get_yscale() == "log"
    assert f"{len(demo_alignment.diverged)} of {len(rows)} tensors out of tolerance" in ax.get_title(loc="left")


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_writes_each_format(demo_alignment: Alignment, tmp_path: Path, suffix: str, magic: bytes) -> None:
    target = tmp_path / f"errors{suffix}"
    assert plot_alignment(demo_alignment, target) == target
    assert target.read_bytes().startswith(magic)
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temporary file left behind


def test_png_has_the_expected_size(demo_alignment: Alignment, tmp_path: Path) -> None:
    target = plot_alignment(demo_alignment, tmp_path / "errors.png", dpi=100)
    header = target.read_bytes()[16:24]
    assert (int.from_bytes(header[:4], "big"), int.from_bytes(header[4:], "big")) == (1000, 400)


def test_unknown_suffix_is_refused_before_drawing(demo_alignment: Alignment, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"errors\.jpg: unknown image type '\.jpg'; use a \.png, \.svg or \.pdf"):
        plot_alignment(demo_alignment, tmp_path / "errors.jpg")
    assert not any(tmp_path.iterdir())


def test_missing_matplotlib_is_one_clear_line(demo_run: DemoResult, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes `import matplotlib.figure` fail
    with pytest.raises(UsageError, match=r"^matplotlib is not installed; install it with: pip install "
                                         r"'tracediff\[plot\]'$"):
        plot_alignment(demo_run.alignment, tmp_path / "errors.png")
    code = main(["plot", str(demo_run.reference_trace), str(demo_run.port_trace), "-o", str(tmp_path / "e.png")])
    assert code == 2
    assert capsys.readouterr().err == ("tracediff plot: error: matplotlib is not installed; install it with: "
                                       "pip install 'tracediff[plot]'\n")


def test_cli_plot_writes_the_image_and_names_the_first_divergence(demo_run: DemoResult, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "errors.png"
    code = main(["plot", str(demo_run.reference_trace), str(demo_run.port_trace), "--map", str(demo_run.rename_map),
                 "-o", str(target), "--title", "demo"])
    assert code == 0
    assert target.read_bytes().startswith(b"\x89PNG")
    first = demo_run.alignment.first_divergence
    assert first is not None
    assert capsys.readouterr().out == (f"wrote {target} ({len(demo_run.alignment.rows)} tensors; first divergence: "
                                       f"{first.module_path_b} {first.tensor})\n")


def test_nan_errors_are_marked_at_the_top(demo_alignment: Alignment) -> None:
    from dataclasses import replace

    rows = list(demo_alignment.rows)
    rows[3] = replace(rows[3], max_abs_err=math.nan, max_rel_err=math.nan, status="shape_mismatch",
                      within_tolerance=None)
    fig = error_figure(replace(demo_alignment, rows=tuple(rows)))
    (ax,) = fig.axes
    marks = [c for c in ax.collections if c.get_label() == "not comparable"]
    assert len(marks) == 1 and [int(x) for x, _ in marks[0].get_offsets()] == [3]
