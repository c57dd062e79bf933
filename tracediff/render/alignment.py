"""Rendering an ``Alignment`` as a console table, Markdown, CSV or JSON.

JSON is strict (parsable by any JSON reader): NaN becomes ``null`` and
infinities become the strings ``"inf"`` and ``"-inf"``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tabulate import tabulate

from ..alignment.result import Alignment, TensorComparison

_SHOWN = ["order", "module_path_b", "tensor", "shape_b", "dtype_b", "max_abs_err", "max_rel_err", "cosine",
          "mismatch_fraction", "status", "origin"]
_HEADERS = ["#", "module (B)", "tensor", "shape", "dtype", "max abs", "max rel", "cosine", "mismatch", "status",
            "origin"]


def strict_json_value(value: Any) -> Any:
    """Replace NaN by None and infinities by strings, recursively."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {k: strict_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json_value(v) for v in value]
    return value


def render_json(result: Alignment) -> str:
    return json.dumps(strict_json_value(result.to_dict()), indent=2, allow_nan=False, default=str)


def render_csv(result: Alignment) -> str:
    return str(result.table.to_csv(index=False))


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value) or "scalar"
    if isinstance(value, str) and value.startswith("torch."):
        return value[len("torch."):]
    return str(value)


def _cells(row: TensorComparison, first: TensorComparison | None) -> list[str]:
    data: dict[str, Any] = row.to_dict()
    data["shape_b"] = row.shape_b
    if not math.isnan(row.cosine):
        data["cosine"] = f"{row.cosine:.6f}"
    if row.approximate:
        data["status"] = f"{row.status} (stats)"
    marker = ">>" if first is not None and row.order == first.order else ""
    return [marker] + [_fmt(data[key]) for key in _SHOWN]


def headline(result: Alignment) -> list[str]:
    """The summary lines shared by the table and Markdown outputs."""
    s = result.summary()
    statuses = ", ".join(f"{n} {status}" for status, n in sorted(s["statuses"].items())) or "nothing"
    how = "by structure" if result.structural else "by name"
    lines = [
        f"A: {result.trace_a} ({result.model_a})",
        f"B: {result.trace_b} ({result.model_b})",
        f"matched {s['matched_nodes']} module calls {how}; compared {s['compared']} tensors: {statuses}"
        + (f" ({s['approximate']} from statistics only)" if s["approximate"] else ""),
    ]
    if result.unmatched_a or result.unmatched_b:
        lines.append(f"unmatched: {len(result.unmatched_a)} in A only, {len(result.unmatched_b)} in B only")
    first = result.first_divergence
    if first is None:
        unreadable = len(result.unreadable)
        lines.append("PASSED: every compared tensor is within tolerance" if result.passed
                     else f"NOT PASSED: {unreadable} tensor(s) could not be read")
    else:
        lines.append(f"FIRST DIVERGENCE ({first.origin}): {first.describe()}")
        if first.input_err is not None and first.amplification is not None:
            lines.append(f"  what flowed into this call had max_abs_err={first.input_err:.3g}; "
                         f"amplification={_fmt(first.amplification)}")
        if first.origin == "between modules":
            parent = first.module_path_b.rsplit(".", 1)[0]
            lines.append(f"  every earlier tensor matched: the code of {parent} between its submodule calls "
                         "changed this input")
        backward = result.first_backward_divergence
        if backward is not None and backward is not first:
            lines.append(f"FIRST GRADIENT DIVERGENCE ({backward.origin}): {backward.describe()}")
    return lines


def _window(result: Alignment, all_rows: bool, context: int) -> list[TensorComparison]:
    rows = list(result.rows)
    if all_rows:
        return rows
    first = result.first_divergence
    if first is None:
        return [r for r in rows if r.status not in ("identical", "close")][: 2 * context + 1]
    i = rows.index(first)
    return rows[max(0, i - context): i + context + 1]


def render_table(result: Alignment, *, all_rows: bool = False, context: int = 5, tablefmt: str = "simple") -> str:
    """Summary, first divergence, and the rows around it (every row with ``all_rows``)."""
    lines = headline(result)
    shown = _window(result, all_rows, context)
    first = result.first_divergence
    if shown:
        table = tabulate([_cells(r, first) for r in shown], headers=[""] + _HEADERS, tablefmt=tablefmt,
                         disable_numparse=True)
        lines += ["", table]
        if not all_rows and len(shown) < len(result.rows):
            lines.append(f"({len(shown)} of {len(result.rows)} rows shown; --all shows every row)")
    if result.argument_diffs:
        lines += ["", f"non-tensor values that differ ({len(result.argument_diffs)}):"]
        lines += [f"  {d.module_path_b} {d.slot}: {d.detail}" for d in result.argument_diffs[:10]]
    if result.suggested_rename:
        lines += ["", "suggested rename rules (A -> B), save with --suggest-map FILE:"]
        lines += [f"  {a!r} -> {b!r}" for a, b in result.suggested_rename[:10]]
    lines += [f"warning: {w}" for w in result.warnings]
    return "\n".join(lines) + "\n"


def render_markdown(result: Alignment, *, all_rows: bool = False, context: int = 5) -> str:
    head = "\n".join(f"- {line}" for line in headline(result))
    shown = _window(result, all_rows, context)
    first = result.first_divergence
    table = tabulate([_cells(r, first) for r in shown], headers=[""] + _HEADERS, tablefmt="github",
                     disable_numparse=True) if shown else ""
    return f"{head}\n\n{table}\n"
