"""The HTML report as a file: self-contained, escaped, compact, and reachable from the library and the CLI."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import pytest

from tests.render.hostile import PAYLOADS, hostile, scaled
from tracediff.alignment.result import TABLE_COLUMNS, Alignment
from tracediff.cli.main import main
from tracediff.demo import DemoResult
from tracediff.render.html import render_html

_DATA = re.compile(r'<script type="application/json" id="tracediff-data">(.*?)</script>', re.S)


def _embedded(page: str) -> dict:
    (block,) = _DATA.findall(page)
    return json.loads(block)


def _decoded_rows(data: dict) -> list[dict]:
    def value(v: object) -> object:
        if isinstance(v, list):
            return data["strings"][v[0]]
        return {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}.get(v, v) if isinstance(v, str) \
            else v
    return [dict(zip(data["columns"], map(value, row))) for row in data["rows"]]


def test_report_embeds_every_row_and_marks_the_first_divergence(demo_alignment: Alignment) -> None:
    page = render_html(demo_alignment)
    data = _embedded(page)
    # every column once: the symmetric aliases (call_index_a, tensor_b) would repeat call_index and tensor
    assert data["columns"] == [c for c in TABLE_COLUMNS if c not in ("call_index_a", "tensor_b")]
    assert len(set(data["columns"])) == len(data["columns"]) and {"call_index", "tensor"} <= set(data["columns"])
    rows = _decoded_rows(data)
    assert len(rows) == len(demo_alignment.rows)
    first = demo_alignment.first_divergence
    assert first is not None and data["first"] == first.order
    for decoded, row in zip(rows, demo_alignment.rows):
        assert decoded["module_path_b"] == row.module_path_b and decoded["status"] == row.status
        assert decoded["max_abs_err"] == pytest.approx(row.max_abs_err, rel=1e-4)
        assert decoded["within_tolerance"] is row.within_tolerance
    assert 'data-verdict="diverged"' in page
    assert f'<div id="first-divergence" class="first" data-order="{first.order}">' in page
    assert '<span class="tag first-tag">first divergence</span>' in page


def test_report_opens_offline(demo_alignment: Alignment) -> None:
    page = render_html(demo_alignment)
    assert "default-src 'none'" in page  # the page may not load anything, even by mistake
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert not re.search(r"@import|url\(", page)
    assert re.findall(r"https?://[^\s\"'<>]+", page) == ["http://www.w3.org/2000/svg"]  # a namespace, not a fetch


def test_static_files_cannot_close_their_own_element() -> None:
    for name in ("report.js", "report.css"):
        text = resources.files("tracediff.render").joinpath(name).read_text(encoding="utf-8")
        assert "</" not in text, name


def test_hostile_names_are_escaped_everywhere(demo_alignment: Alignment) -> None:
    evil = hostile(demo_alignment)
    page = render_html(evil)
    for payload in PAYLOADS[:2]:
        assert payload not in page
    assert page.count("<script") == 2 and page.count("</script>") == 2  # the JSON block and the code
    assert "&lt;img src=x onerror=&quot;window.__xss=1&quot;&gt;" in page
    rows = _decoded_rows(_embedded(page))  # the JSON survives intact
    assert [r["module_path_b"] for r in rows] == [r.module_path_b for r in evil.rows]
    assert "\u2028" not in _DATA.findall(page)[0]  # a raw line separator would end a JS string in old engines


def test_thousands_of_tensors_stay_a_reasonable_file(demo_alignment: Alignment) -> None:
    big = scaled(demo_alignment, 60)
    assert len(big.rows) > 5000
    page = render_html(big)
    per_row = len(page.encode()) / len(big.rows)
    assert per_row < 400, f"{per_row:.0f} bytes per compared tensor"
    assert len(_embedded(page)["rows"]) == len(big.rows)


def test_passing_alignment_says_so(demo_alignment: Alignment) -> None:
    from dataclasses import replace

    ok_rows = tuple(replace(r, within_tolerance=True, status="close", origin=None) for r in demo_alignment.rows)
    page = render_html(replace(demo_alignment, rows=ok_rows))
    assert 'data-verdict="passed"' in page and "Every compared tensor is within tolerance." in page
    assert _embedded(page)["first"] is None


def test_to_html_is_the_renderer(demo_alignment: Alignment) -> None:
    assert demo_alignment.to_html() == render_html(demo_alignment)


def test_cli_align_writes_the_report(demo_run: DemoResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "report.html"
    code = main(["align", str(demo_run.reference_trace), str(demo_run.port_trace), "--map", str(demo_run.rename_map),
                 "--format", "html", "-o", str(target)])
    assert code == 1  # the traces diverge
    page = target.read_text(encoding="utf-8")
    assert _embedded(page)["first"] == demo_run.alignment.first_divergence.order
    assert capsys.readouterr().out == ""


def test_core_imports_no_renderer_and_no_matplotlib() -> None:
    """Module-level imports of the alignment core, ``show`` and the demo: no HTML/plot renderer, CLI or matplotlib."""
    import ast

    package = Path(__file__).resolve().parents[2] / "tracediff"
    files = [*(path for stage in ("alignment", "compare", "maps") for path in sorted((package / stage).rglob("*.py"))),
             package / "show.py", *sorted((package / "demo").glob("*.py"))]
    offending = []
    for file in files:
        for node in ast.parse(file.read_text(encoding="utf-8")).body:  # top level only: lazy imports are fine
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [f"{'.' * node.level}{node.module or ''}"] + \
                    [f"{'.' * node.level}{node.module or ''}.{alias.name}" for alias in node.names]
            offending += [f"{file.name}: {n}" for n in names
                          if n.startswith("matplotlib") or any(part in n for part in ("render.html", "render.plot",
                                                                                      "cli"))]
    assert len(files) > 8 and offending == []
