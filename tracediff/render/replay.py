"""Rendering a ``Replay`` as a console table, Markdown, CSV, JSON or a self-contained HTML page.

Module paths, slot names and reasons come from traces and from the port's
exceptions: they are escaped for the terminal, Markdown and HTML alike.
JSON is strict: NaN becomes ``null``, infinities ``"inf"``/``"-inf"``.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

from ..replaying.result import Replay, ReplayedCall
from .alignment import strict_json_value
from .grid import grid
from .text import markdown_text, printable

_HEADERS = ["#", "module (B)", "call", "local max abs", "local rel rms", "x noise", "verdict", "culprit"]


def render_json(result: Replay) -> str:
    return json.dumps(strict_json_value(result.to_dict()), indent=2, allow_nan=False, default=str)


def render_csv(result: Replay) -> str:
    return str(result.table.to_csv(index=False))


def _num(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.{digits}g}"


def _culprit_mark(call: ReplayedCall) -> str:
    if call.culprit:
        return f"#{call.rank}" + (f" ({call.patch_effect:.0f}% of final error)" if call.patch_effect is not None
                                  else "")
    return "explained" if call.explained_by else ""


def _cells(call: ReplayedCall) -> list[str]:
    worst = call.worst
    return [str(call.order), call.module_path_b, str(call.call_index), _num(call.local_max_abs_err),
            _num(call.local_rel_rms_err), _num(worst.factor if worst else None, 2), call.verdict, _culprit_mark(call)]


def headline(result: Replay) -> list[str]:
    """The summary lines shared by the table and Markdown outputs."""
    oracle = f"float64 oracle on (same math within {result.noise_multiplier:g}x precision noise)" if result.oracle \
        else "oracle off (the tolerance alone decides)"
    lines = [f"A: {result.trace_a}", f"B: {result.model_b} on {result.device}; {oracle}",
             f"replayed {len(result.modules)} module calls, skipped {len(result.skipped)}"]
    if result.end_to_end is not None:
        e2e = result.end_to_end
        lines.append(f"B's whole forward on A's inputs: final output max abs err {_num(e2e['max_abs_err'])}, "
                     f"relative rms {_num(e2e['rel_rms_err'])}")
    culprits = result.culprits
    if result.verdict == "passed":
        lines.append("PASSED: no culprit")
        return lines
    if result.verdict == "nothing compared":
        lines.append(f"NOTHING COMPARED: {result.nothing_compared}")
    elif not culprits:
        lines.append("UNDECIDED: no culprit, but calls that could not be judged may hold the mistake:")
    else:
        lines.append(f"CULPRITS ({len(culprits)}), in execution order:")
    for call in culprits:
        effect = f"; patching it removes {call.patch_effect:.0f}% of the final error" \
            if call.patch_effect is not None else ""
        lines.append(f"  #{call.rank} {call.module_path_b} (call {call.call_index}): local max abs err "
                     f"{_num(call.local_max_abs_err)}, {call.reason}{effect}")
    if culprits and result.undecided:
        lines.append(f"UNDECIDED ({len(result.undecided)}):")
    lines += [f"  {why}" for why in result.undecided]
    return lines


def _shown(result: Replay, all_rows: bool) -> list[ReplayedCall]:
    if all_rows:
        return list(result.modules)
    return [c for c in result.modules if c.culprit or c.explained_by or c.verdict not in ("same math",
                                                                                          "within tolerance")]


def render_table(result: Replay, *, all_rows: bool = False) -> str:
    """Summary, culprits, and the calls that did not pass (every call with ``all_rows``)."""
    lines = [printable(line) for line in headline(result)]
    shown = _shown(result, all_rows)
    if shown:
        rows = [[printable(cell) for cell in _cells(c)] for c in shown]
        lines += ["", grid(rows, _HEADERS)]
        if not all_rows and len(shown) < len(result.modules):
            lines.append(f"({len(shown)} of {len(result.modules)} calls shown; --all shows every call)")
    not_comparable = [c for c in result.modules if c.verdict == "not comparable"]
    if not_comparable:
        lines += ["", f"not comparable ({len(not_comparable)}):"]
        lines += [printable(f"  {c.module_path_b} (call {c.call_index}): {c.reason}") for c in not_comparable[:10]]
    if result.skipped:
        lines += ["", f"skipped ({len(result.skipped)}):"]
        lines += [printable(f"  {s.module_path_b} (call {s.call_index}): {s.reason}") for s in result.skipped[:10]]
        if len(result.skipped) > 10:
            lines.append(f"  ... and {len(result.skipped) - 10} more (--format json lists them all)")
    lines += [printable(f"warning: {w}") for w in result.warnings]
    return "\n".join(lines) + "\n"


def render_markdown(result: Replay, *, all_rows: bool = False) -> str:
    head = "\n".join(f"- {markdown_text(line.strip())}" for line in headline(result))
    shown = _shown(result, all_rows)
    rows = [[markdown_text(cell) for cell in _cells(c)] for c in shown]
    table = grid(rows, _HEADERS, markdown=True) if rows else ""
    skipped = "\n".join(f"- {markdown_text(f'{s.module_path_b} (call {s.call_index}): {s.reason}')}"
                        for s in result.skipped)
    return f"{head}\n\n{table}\n" + (f"\n**Skipped**\n\n{skipped}\n" if skipped else "")


_STYLE = """body{font:14px system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}
tr.culprit td{background:#fde2e2}tr.nc td{background:#fff6d6}tr.explained td{background:#eef3ff}
td.num{text-align:right;font-variant-numeric:tabular-nums}.pass{color:#176117}.fail{color:#a11}"""


def _end_to_end(alignment: Any) -> dict[tuple[str, int, str], float]:
    """align's max abs error per (B's module path, call index, tensor), from B's own trace."""
    if alignment is None:
        return {}
    return {(row.module_path_b, row.call_index, row.tensor): row.max_abs_err for row in alignment.rows}


def render_html(result: Replay, alignment: Any = None) -> str:
    """One offline page: the verdict, the culprits, every replayed call with its local error and, given
    ``alignment`` (``tracediff.align`` of A and B's own trace), the end-to-end error next to it."""
    e = html.escape
    e2e = _end_to_end(alignment)
    verdict = {"passed": "<p class=pass>PASSED: no culprit</p>",
               "diverged": f"<p class=fail>{len(result.culprits)} culprit(s)</p>",
               "nothing compared": f"<p class=fail>NOTHING COMPARED: {e(result.nothing_compared or '')}</p>",
               }.get(result.verdict, "<p class=fail>UNDECIDED: calls that could not be judged may hold the mistake</p>")
    head = "".join(f"<li>{e(line.strip())}</li>" for line in headline(result))
    extra = "<th>end-to-end max abs (align)</th>" if alignment is not None else ""
    body = []
    for call in result.modules:
        css = "culprit" if call.culprit else "nc" if call.verdict == "not comparable" else \
            "explained" if call.explained_by else ""
        for t in call.tensors:
            end = e2e.get((call.module_path_b, call.call_index, t.tensor))
            cell = f"<td class=num>{e(_num(end))}</td>" if alignment is not None else ""
            body.append(
                f"<tr class='{css}'><td class=num>{call.order}</td><td>{e(call.module_path_b)}</td>"
                f"<td class=num>{call.call_index}</td><td>{e(t.tensor)}</td>"
                f"<td class=num>{e(_num(t.local_max_abs_err))}</td>{cell}"
                f"<td class=num>{e(_num(t.local_rel_rms_err))}</td><td class=num>{e(_num(t.precision_noise))}</td>"
                f"<td class=num>{e(_num(t.math_diff))}</td><td class=num>{e(_num(t.factor, 2))}</td>"
                f"<td>{e(t.verdict)}</td><td>{e(_culprit_mark(call))}</td><td>{e(t.reason or call.reason)}</td></tr>")
    skipped = "".join(f"<tr><td>{e(s.module_path_b)}</td><td class=num>{s.call_index}</td><td>{e(s.reason)}</td></tr>"
                      for s in result.skipped)
    skipped_table = (f"<h2>Skipped ({len(result.skipped)})</h2><table><tr><th>module (B)</th><th>call</th>"
                     f"<th>reason</th></tr>{skipped}</table>") if skipped else ""
    warnings = "".join(f"<li>{e(w)}</li>" for w in result.warnings)
    return (f"<!doctype html><html><head><meta charset=utf-8><title>tracediff replay</title>"
            f"<style>{_STYLE}</style></head><body><h1>tracediff replay</h1>{verdict}<ul>{head}</ul>"
            f"<h2>Replayed calls</h2><table><tr><th>#</th><th>module (B)</th><th>call</th><th>tensor</th>"
            f"<th>local max abs</th>{extra}<th>local rel rms</th><th>B's precision noise</th>"
            f"<th>A vs B's exact math</th><th>x noise</th><th>verdict</th><th>culprit</th><th>reason</th></tr>"
            f"{''.join(body)}</table>{skipped_table}"
            + (f"<h2>Warnings</h2><ul>{warnings}</ul>" if warnings else "") + "</body></html>\n")
