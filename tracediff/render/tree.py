"""Rendering a ``TraceView`` (``tracediff show``) as an indented tree, JSON or CSV.

The tree puts one line per call (its name relative to its parent, its class,
its call index) and one line per tensor under it, with the columns (shape,
dtype, mean, std, min, max) aligned across the whole tree. Tensors holding
NaN or Inf are flagged ``NaN/Inf``, with their counts when recorded.

JSON is strict: NaN becomes ``null``, infinities ``"inf"``/``"-inf"``.
CSV has one row per tensor.
"""

from __future__ import annotations

import csv
import io
import json
import math

from .._text import printable
from ..show import NodeView, TensorView, TraceView
from .strict_json import strict_json_value

_INDENT = "  "
_STAT_HEADERS = ["shape", "dtype", "mean", "std", "min", "max", ""]
CSV_COLUMNS = ["module_path", "relative_path", "call_index", "module_type", "phase", "depth", "slot", "order", "shape",
               "dtype", "mean", "std", "min", "max", "nan", "posinf", "neginf", "nonfinite", "has_payload"]


def _number(value: float | None) -> str:
    if value is None:
        return ""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.4g}"


def _shape(shape: tuple[int, ...] | None) -> str:
    if shape is None:
        return "?"
    return "x".join(str(n) for n in shape) or "scalar"


def _flag(tensor: TensorView) -> str:
    if not tensor.nonfinite:
        return ""
    counts = [f"{n} {label}" for n, label in ((tensor.nan, "nan"), (tensor.posinf, "+inf"), (tensor.neginf, "-inf"))
              if n]
    return "NaN/Inf" + (f" ({', '.join(counts)})" if counts else "")


def _slot(slot: str) -> str:
    """``inputs.args.0`` -> ``in args.0``; ``outputs.1`` -> ``out 1``; ``grad_inputs.0`` -> ``grad in 0``."""
    head, _, rest = slot.partition(".")
    label = {"inputs": "in", "outputs": "out", "grad_outputs": "grad out", "grad_inputs": "grad in"}.get(head, head)
    return f"{label} {rest}".rstrip()


def _node_line(node: NodeView) -> str:
    kind = f"  [{node.module_type}]" if node.module_type and node.module_type != node.name else ""
    call = f"  (call {node.call_index})" if node.call_index else ""
    flags = "  !NaN/Inf" if node.nonfinite else ""
    error = f"  raised {node.error}" if node.error else ""
    return f"{_INDENT * node.depth}{node.name}{kind}{call}{flags}{error}"


def render_tree(view: TraceView) -> str:
    """The indented call tree with aligned statistics, a header and a NaN/Inf footer."""
    lines: list[tuple[str, list[str] | None]] = []
    phase = "forward"
    for node in view.nodes:
        if node.phase != phase:
            phase = node.phase
            lines.append((f"{phase} pass (gradients, in the order they arrived):", None))
        lines.append((_node_line(node), None))
        pad = _INDENT * (node.depth + 1)
        for slot, text in node.values:
            lines.append((f"{pad}{_slot(slot)} = {text}", None))
        for t in node.tensors:
            cells: list[str] = [_shape(t.shape), (t.dtype or "?").removeprefix("torch."), _number(t.mean),
                                _number(t.std), _number(t.min), _number(t.max), _flag(t)]
            lines.append((f"{pad}{_slot(t.slot)}", cells))
    first_width = max([len(text) for text, cells in lines if cells is not None] + [len("module / tensor")])
    widths = [len(h) for h in _STAT_HEADERS]
    for _, stats in lines:
        if stats is not None:
            widths = [max(w, len(c)) for w, c in zip(widths, stats)]

    def row(first: str, cells: list[str]) -> str:
        # Statistics (mean..max) right-aligned, the rest left-aligned.
        parts = [first.ljust(first_width)] + [c.rjust(w) if 2 <= i < 6 else c.ljust(w)
                                              for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(parts).rstrip()

    out = [_header(view), "", row("module / tensor", _STAT_HEADERS)]
    out += [row(text, cells) if cells is not None else text for text, cells in lines]
    out += ["", _footer(view)]
    return printable("\n".join(out), keep_newlines=True) + "\n"  # no terminal escapes from trace names


def _header(view: TraceView) -> str:
    kind = "summary (statistics only)" if view.summary_only else "trace"
    calls = sum(node.op is None for node in view.nodes)
    ops = len(view.nodes) - calls
    shown = f"{calls} of {view.total_calls} calls" if calls != view.total_calls else f"{view.total_calls} calls"
    shown += f" and {ops} ops" if ops else ""
    state = {True: "", False: ", INCOMPLETE", None: ""}[view.complete]
    if view.incomplete_reason:
        state = f", INCOMPLETE ({view.incomplete_reason})"
    filters = "".join([f", path {view.path!r}" if view.path else "",
                       f", depth {view.depth}" if view.depth is not None else ""])
    return f"{view.model_name}: {view.producer} {kind} at {view.json_file}; {shown}{filters}{state}"


def _footer(view: TraceView) -> str:
    found = view.nonfinite
    if not found:
        return "no NaN/Inf in the shown tensors"
    return f"{len(found)} shown tensor(s) hold NaN/Inf; the first is {view.first_nonfinite}"


def render_json(view: TraceView) -> str:
    return json.dumps(strict_json_value(view.to_dict()), indent=2, allow_nan=False)


def render_csv(view: TraceView) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for node, t in view.tensors:
        shape = "x".join(str(n) for n in t.shape) if t.shape is not None else ""
        writer.writerow([node.module_path, node.relative_path, node.call_index, node.module_type or "", node.phase,
                         node.depth,
                         t.slot, t.order, shape, t.dtype or "", *(_number(v) for v in (t.mean, t.std, t.min, t.max)),
                         *("" if n is None else n for n in (t.nan, t.posinf, t.neginf)), t.nonfinite, t.has_payload])
    return buffer.getvalue()
