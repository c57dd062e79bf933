"""The HTML report in a real headless Chromium: it renders, sorts, filters, pages, and runs no injected script.

Driven through the DevTools protocol (``tests/render/browser.py``): clicks and
typing are real input events. A screenshot of the demo report is kept as
``artifacts/report.png``. Skips only when no Chromium is installed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.render.browser import Browser, find_chromium
from tests.render.hostile import PAYLOADS, hostile, scaled
from tests.render.test_html import _decoded_rows, _embedded
from tracediff.alignment.result import Alignment
from tracediff.demo import DemoResult
from tracediff.render.html import render_html

CHROMIUM = find_chromium()
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
READY = "document.body.dataset.ready === '1'"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium found: install it with `apt-get install -y chromium` "
                                                "(or point TRACEDIFF_CHROMIUM at a Chromium binary)"),
]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    assert CHROMIUM is not None
    b = Browser(CHROMIUM, tmp_path_factory.mktemp("chromium-profile"), width=1280, height=900)
    yield b
    b.close()


def _open(browser: Browser, page: Path) -> None:
    browser.exceptions.clear()
    browser.open(page.as_uri(), ready=READY)


def _shown_orders(browser: Browser) -> list[int]:
    return browser.evaluate("[...document.querySelectorAll('#rows tbody tr[data-order]')].map(r => +r.dataset.order)")


def _set_filter(browser: Browser, text: str) -> None:
    browser.evaluate("(() => { const f = document.getElementById('filter'); f.value = '';"
                     " f.dispatchEvent(new Event('input')); })()")
    if text:
        browser.type("#filter", text)


def _sorted_orders(rows: list[dict], column: str, descending: bool) -> list[int]:
    present = [r for r in rows if isinstance(r[column], (int, float)) and not math.isnan(r[column])]
    kept = {r["order"] for r in present}
    missing = [r["order"] for r in rows if r["order"] not in kept]
    sign = -1 if descending else 1
    return [r["order"] for r in sorted(present, key=lambda r: (sign * r[column], r["order"]))] + sorted(missing)


def _haystack(row: dict) -> str:
    keys = ("module_path_a", "module_path_b", "tensor", "tensor_a", "status", "module_type", "origin", "reason",
            "dtype_b")
    return " ".join("" if row[k] is None else str(row[k]) for k in keys).lower()


def test_demo_report_renders_verdict_plot_tree_and_table(browser: Browser, demo_run: DemoResult) -> None:
    _open(browser, demo_run.report)
    first = demo_run.alignment.first_divergence
    assert first is not None
    where = browser.evaluate("document.querySelector('#first-divergence .where').textContent")
    assert where.startswith(demo_run.bug_module) and first.tensor in where
    assert browser.evaluate("document.querySelector('.verdict .badge').textContent") == "DIVERGED"
    # The plot: one line per series, a red mark per row out of tolerance, the first divergence marked.
    plot = browser.evaluate("""(() => { const s = document.querySelector('#plot-area svg');
        return {abs: s.querySelectorAll('path.line.abs').length, rel: s.querySelectorAll('path.line.rel').length,
                tol: s.querySelectorAll('path.line.tol').length, bad: s.querySelectorAll('circle.bad').length,
                firstLine: +s.querySelector('line.first-line').getAttribute('x1'),
                label: s.querySelector('text.first-label').textContent,
                width: s.getBoundingClientRect().width}; })()""")
    assert (plot["abs"], plot["rel"], plot["tol"]) == (1, 1, 1)
    assert plot["bad"] == len(demo_run.alignment.diverged)
    assert plot["label"] == f"first divergence: {first.module_path_b} {first.tensor}"
    bad_xs = browser.evaluate("[...document.querySelectorAll('#plot-area circle.bad')].map(c => +c.getAttribute('cx'))")
    assert min(bad_xs) == pytest.approx(plot["firstLine"])  # the line sits on the first red point
    assert plot["width"] > 1000
    # The table: every row on one page, the first divergence highlighted.
    assert _shown_orders(browser) == [row.order for row in demo_run.alignment.rows]
    assert browser.evaluate("+document.querySelector('#rows tr.first-row').dataset.order") == first.order
    # The tree: the first divergence is visible, every <details> above it open.
    closed_above = browser.evaluate("""(() => { let e = document.querySelector('.tree .first-tag'); let n = 0;
        while ((e = e.parentElement.closest('details'))) if (!e.open) n += 1; return n; })()""")
    assert closed_above == 0
    assert browser.evaluate("document.querySelector('.tree .first-tag').getBoundingClientRect().height") > 0
    assert browser.exceptions == []
    ARTIFACTS.mkdir(exist_ok=True)
    browser.screenshot(ARTIFACTS / "report.png")
    assert (ARTIFACTS / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sorting_and_filtering_follow_clicks_and_typing(browser: Browser, demo_run: DemoResult) -> None:
    _open(browser, demo_run.report)
    rows = _decoded_rows(_embedded(demo_run.report.read_text(encoding="utf-8")))
    browser.click('#rows th[data-col="max_abs_err"]')
    assert browser.evaluate("document.querySelector('#rows th[data-col=\"max_abs_err\"]').getAttribute('aria-sort')") \
        == "descending"
    assert _shown_orders(browser) == _sorted_orders(rows, "max_abs_err", descending=True)
    browser.click('#rows th[data-col="max_abs_err"]')
    assert _shown_orders(browser) == _sorted_orders(rows, "max_abs_err", descending=False)
    browser.click('#rows th[data-col="module_path_b"]')
    assert _shown_orders(browser) == [r["order"] for r in sorted(rows, key=lambda r: (r["module_path_b"], r["order"]))]

    browser.click('#rows th[data-col="order"]')
    browser.type("#filter", "rotary outputs")
    expected = [r["order"] for r in rows if all(w in _haystack(r) for w in ("rotary", "outputs"))]
    assert len(expected) == 6  # two outputs per layer, three layers
    assert _shown_orders(browser) == expected
    browser.click("#only-bad")
    assert _shown_orders(browser) == [o for o in expected if next(r for r in rows if r["order"] == o)
                                      ["within_tolerance"] is False]
    _set_filter(browser, "no-such-module")
    assert _shown_orders(browser) == []
    assert browser.evaluate("document.getElementById('page-info').textContent") == "no matching rows"
    browser.click("#only-bad")
    _set_filter(browser, "")
    assert len(_shown_orders(browser)) == len(rows)
    # A row click unfolds every column of that row.
    browser.click('#rows tr[data-order="3"]')
    detail = browser.evaluate("document.querySelector('#rows tr.detail').textContent")
    assert "required_atol" in detail and "module_path_a" in detail
    assert browser.exceptions == []


def test_links_from_header_and_plot_jump_to_the_row(browser: Browser, demo_run: DemoResult) -> None:
    _open(browser, demo_run.report)
    first = demo_run.alignment.first_divergence
    assert first is not None
    browser.type("#filter", "q_proj")
    browser.click('[data-order-link="first"]')
    assert browser.evaluate("+document.querySelector('#rows tr.marked').dataset.order") == first.order
    assert browser.evaluate("document.getElementById('filter').value") == ""
    browser.click("#plot-area circle.bad")  # the first red point: the hit area passes the click to the plot
    assert browser.evaluate("+document.querySelector('#rows tr.marked').dataset.order") == first.order
    assert browser.exceptions == []


def test_thousands_of_rows_are_paged(browser: Browser, demo_alignment: Alignment, tmp_path: Path) -> None:
    big = scaled(demo_alignment, 60)
    page = tmp_path / "big.html"
    page.write_text(render_html(big), encoding="utf-8")
    _open(browser, page)
    assert _shown_orders(browser) == list(range(100))
    assert browser.evaluate("document.getElementById('page-info').textContent") == f"rows 1\u2013100 of {len(big.rows)}"
    browser.click("#next")
    assert _shown_orders(browser) == list(range(100, 200))
    browser.click('#rows th[data-col="max_rel_err"]')
    rows = _decoded_rows(_embedded(page.read_text(encoding="utf-8")))
    assert _shown_orders(browser) == _sorted_orders(rows, "max_rel_err", descending=True)[:100]
    assert browser.evaluate("document.querySelectorAll('#plot-area circle.bad').length") == len(big.diverged)
    assert browser.exceptions == []


def test_hostile_names_are_shown_as_text_and_never_run(browser: Browser, demo_alignment: Alignment,
                                                       tmp_path: Path) -> None:
    evil = hostile(demo_alignment)
    page = tmp_path / "evil.html"
    page.write_text(render_html(evil), encoding="utf-8")
    _open(browser, page)
    assert browser.evaluate("typeof window.__xss") == "undefined"
    assert browser.evaluate("document.querySelectorAll('img').length") == 0
    cells = browser.evaluate("[...document.querySelectorAll('#rows tbody tr')].map(r => r.children[1].textContent)")
    assert cells[:3] == [r.module_path_b for r in evil.rows[:3]]
    assert PAYLOADS[1] in browser.evaluate("document.querySelector('#notes').textContent")
    browser.evaluate("document.querySelector('#plot-area svg').dispatchEvent(new Event('mouseover'))")
    assert browser.evaluate("typeof window.__xss") == "undefined"
    assert browser.exceptions == []
    assert browser.evaluate("document.title") == f"DIVERGED: {PAYLOADS[0]} vs {evil.model_a} \u00b7 tracediff"
