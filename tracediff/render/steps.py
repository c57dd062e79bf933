"""Rendering a :class:`tracediff.StepComparison` as a text table, JSON or CSV.

Rendering only formats: every number comes from the result object.
``render_json`` writes strict JSON: NaN and infinities become the strings
``"NaN"``, ``"Infinity"`` and ``"-Infinity"``. ``render_csv`` writes the
per-step summary, one row per ``(step, rank)``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..steps.result import StepComparison, StepDivergence, StepSummary
from .grid import grid

_HASH_WIDTH = 16


def render_steps(result: StepComparison, fmt: str) -> str:
    """``fmt`` is ``table``, ``json`` or ``csv``."""
    renderers = {"table": render_table, "json": render_json, "csv": render_csv}
    return renderers[fmt](result)


def render_json(result: StepComparison) -> str:
    return json.dumps(_strict(result.to_dict()), indent=2, allow_nan=False)


def render_csv(result: StepComparison) -> str:
    return str(result.steps.to_csv(index=False, lineterminator="\n"))


def render_table(result: StepComparison) -> str:
    lines = [_headline(result)]
    if result.first_divergence is not None:
        lines += ["", _divergence_text(result.first_divergence)]
    lines += ["", _coverage(result), _step_table(result.step_summaries)]
    if result.needed_atol is not None and not result.passed:
        lines += ["", f"every difference would pass with --atol {_round_up(result.needed_atol)}"]
    return "\n".join(lines)


def _headline(result: StepComparison) -> str:
    tolerance = f"atol={result.atol:g}, rtol={result.rtol:g}"
    shared = len({s.step for s in result.step_summaries})
    if result.reason is not None:
        return f"{result.run_a} vs {result.run_b} ({tolerance}): UNDECIDED: {result.reason}"
    if result.passed:
        within = any(s.status == "within_tolerance" for s in result.step_summaries)
        verdict = "within tolerance" if within else "identical"
        return f"{result.run_a} vs {result.run_b} ({tolerance}): {verdict} over {shared} shared steps"
    d = result.first_divergence
    assert d is not None
    return (f"{result.run_a} vs {result.run_b} ({tolerance}): diverged at step {d.step}"
            f"{f' (rank {d.rank})' if _many_ranks(result) else ''}, {d.group} {d.name}")


def _divergence_text(d: StepDivergence) -> str:
    rows = [[row.name, _cell(row.name, row.a), _cell(row.name, row.b), _number(row.diff)] for row in d.stats]
    table = grid(rows, ["", "A", "B", "B - A"])
    return f"first divergence: step {d.step}, rank {d.rank}, group {d.group}, {d.name}: {d.reason}\n{table}"


def _coverage(result: StepComparison) -> str:
    parts = [f"steps compared: {len(result.step_summaries)} records"]
    if result.only_in_a:
        parts.append(f"only in A: {_steps_list(result.only_in_a)}")
    if result.only_in_b:
        parts.append(f"only in B: {_steps_list(result.only_in_b)}")
    broken = [f"step {s.step} in " + " and ".join(side for side, ok in (("A", s.complete_a), ("B", s.complete_b))
                                                  if not ok)
              for s in result.step_summaries if not (s.complete_a and s.complete_b)]
    if broken:
        parts.append(f"incomplete records (the step raised or the run stopped): {', '.join(broken)}")
    if result.groups_skipped:
        parts.append(f"groups recorded by one run only (not compared): {', '.join(result.groups_skipped)}")
    return "; ".join(parts)


def _step_table(summaries: tuple[StepSummary, ...]) -> str:
    incomplete = any(not (s.complete_a and s.complete_b) for s in summaries)
    headers = ["step", "rank", "status", "compared", "differ", "diverged", "max drift", "first difference"]
    align = ["right", "right", "left", "right", "right", "right", "right", "left"]
    if incomplete:
        headers.append("complete A/B")
        align.append("left")
    rows = []
    for s in summaries:
        first = f"{s.first_group} {s.first_name}" if s.first_group else ""
        row = [s.step, s.rank, s.status, s.compared, s.differ, s.diverged, _number(s.max_drift), first]
        if incomplete:
            row.append(f"{'yes' if s.complete_a else 'no'}/{'yes' if s.complete_b else 'no'}")
        rows.append(row)
    return grid(rows, headers, align=align)


def _round_up(value: float) -> str:
    """``value`` to 2 significant digits, rounded up so that the printed tolerance passes."""
    if value <= 0 or not math.isfinite(value):
        return f"{value:g}"
    unit = 10.0 ** (math.floor(math.log10(value)) - 1)
    return f"{math.ceil(value / unit * (1 - 1e-12)) * unit:.2g}"


def _many_ranks(result: StepComparison) -> bool:
    return len({s.rank for s in result.step_summaries}) > 1


def _steps_list(steps: tuple[int, ...]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 8 else f"{steps[0]}..{steps[-1]} ({len(steps)} steps)"


def _cell(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if name == "hash" and isinstance(value, str):
        return value[:_HASH_WIDTH]
    if isinstance(value, float):
        return _number(value)
    text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: float | None) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or (math.isfinite(value) and value == int(value) and abs(value) < 1e15):
        return str(int(value)) if isinstance(value, int) else f"{value:g}"
    return f"{value:.6g}"


def _strict(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value
