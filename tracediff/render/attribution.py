"""Rendering an ``Attribution`` as a console table, Markdown, CSV, JSON or an offline HTML bar chart.

Module paths come from the model and reasons from its exceptions: they are
escaped for the terminal, Markdown and HTML alike. JSON is strict: NaN
becomes ``null``, infinities ``"inf"``/``"-inf"``.
"""

from __future__ import annotations

import html
import json
import math

from ..attribution.result import AttributedCall, Attribution
from .grid import grid
from .strict_json import strict_json_value
from .text import markdown_text, printable

_HEADERS = ["rank", "module (B)", "call", "share of final error", "local error (x noise)", "local rel rms"]
_SHOWN = 20


def render_json(result: Attribution) -> str:
    return json.dumps(strict_json_value(result.to_dict()), indent=2, allow_nan=False, default=str)


def render_csv(result: Attribution) -> str:
    return str(result.table.to_csv(index=False))


def _num(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.{digits}g}"


def _cells(call: AttributedCall) -> list[str]:
    return [str(call.rank), call.module_path, str(call.call_index), f"{call.share:.1%}", _num(call.local_error, 2),
            _num(call.local_rel_rms_err)]


def headline(result: Attribution) -> list[str]:
    """The summary lines shared by the table, Markdown and HTML outputs."""
    lines = [f"A: {result.trace_a}", f"B: {result.model_b}",
             f"final error of B on A's inputs: {result.final_error.describe()}",
             f"ranked {len(result.ranking)} calls ({result.granularity}), skipped {len(result.skipped)}; "
             f"{result.forward_passes} forward passes of B, {result.module_runs} single-module runs, "
             f"{result.seconds:.2f} s"]
    if result.ranking and result.final_error.value > 0:
        left = result.residual_error / result.final_error.value
        lines.append(f"with every ranked call restored, {left:.1%} of the final error is left (what they do not "
                     "explain)")
    return lines


def _budget_lines(result: Attribution) -> list[str]:
    if not result.budget:
        return []
    lines = [f"restore these {len(result.budget)} together (greedy, measured jointly):"]
    for i, step in enumerate(result.budget):
        lines.append(f"  {i + 1}. {step.module_path} (call {step.call_index}): {step.share:.1%} of the final error "
                     f"removed together (sum of the shares alone: {step.summed_share:.1%})")
    return lines


def _shown(result: Attribution, all_rows: bool) -> list[AttributedCall]:
    return list(result.ranking) if all_rows else list(result.ranking[:_SHOWN])


def render_table(result: Attribution, *, all_rows: bool = False) -> str:
    rows = [[printable(cell) for cell in _cells(c)] for c in _shown(result, all_rows)]
    out = [printable(line) for line in headline(result) + _budget_lines(result)]
    out += ["", grid(rows, _HEADERS)]
    if not all_rows and len(result.ranking) > _SHOWN:
        out.append(f"({_SHOWN} of {len(result.ranking)} ranked calls shown; --all shows every call)")
    out += [printable(f"skipped {s.module_path} (call {s.call_index}): {s.reason}") for s in result.skipped]
    return "\n".join(out) + "\n"


def render_markdown(result: Attribution, *, all_rows: bool = False) -> str:
    out = ["# tracediff attribute", ""] + [f"- {markdown_text(line.strip())}" for line in
                                          headline(result) + _budget_lines(result)]
    out += ["", "| " + " | ".join(_HEADERS) + " |", "|" + "---|" * len(_HEADERS)]
    out += ["| " + " | ".join(markdown_text(cell) for cell in _cells(c)) + " |" for c in _shown(result, all_rows)]
    if result.skipped:
        out += ["", "## Skipped", ""] + [f"- {markdown_text(s.module_path)} (call {s.call_index}): "
                                         f"{markdown_text(s.reason)}" for s in result.skipped]
    return "\n".join(out) + "\n"


_STYLE = """body{font:14px system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse}
td,th{padding:2px 8px;text-align:left;border-bottom:1px solid #ddd}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.bar{background:#c0392b;height:12px}.track{width:320px;background:#eee}"""


def render_html(result: Attribution) -> str:
    """One offline page: the final error, then one bar per ranked call (its share of the final error)."""
    e = html.escape
    head = "".join(f"<li>{e(line.strip())}</li>" for line in headline(result) + _budget_lines(result))
    rows = []
    for c in result.ranking:
        width = max(0.0, min(100.0, 100.0 * c.share))
        rows.append(f"<tr><td class=num>{c.rank}</td><td>{e(c.module_path)}</td><td class=num>{c.call_index}</td>"
                    f"<td><div class=track><div class=bar style='width:{width:.1f}%'></div></div></td>"
                    f"<td class=num>{c.share:.1%}</td><td class=num>{e(_num(c.local_error, 2))}</td>"
                    f"<td class=num>{e(_num(c.local_rel_rms_err))}</td></tr>")
    skipped = "".join(f"<li>{e(s.module_path)} (call {s.call_index}): {e(s.reason)}</li>" for s in result.skipped)
    warnings = "".join(f"<li>{e(w)}</li>" for w in result.warnings)
    return ("<!doctype html><html><head><meta charset=utf-8><title>tracediff attribute</title>"
            f"<style>{_STYLE}</style></head><body><h1>tracediff attribute</h1><ul>{head}</ul>"
            "<h2>Share of the final error, by call</h2><table><tr><th>rank</th><th>module (B)</th><th>call</th>"
            "<th colspan=2>share of final error</th><th>local error (x noise)</th><th>local rel rms</th></tr>"
            f"{''.join(rows)}</table>"
            + (f"<h2>Skipped</h2><ul>{skipped}</ul>" if skipped else "")
            + (f"<h2>Warnings</h2><ul>{warnings}</ul>" if warnings else "") + "</body></html>\n")
