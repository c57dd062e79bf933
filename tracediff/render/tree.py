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
from collections.abc import Sequence

from ..show import NodeView, TensorView, TraceView
from .strict_json import strict_json_value
from .text import printable

_INDENT = "  "
CSV_COLUMNS = ["module_path", "relative_path", "call_index", "module_type", "phase", "depth", "slot", "order", "shape",
               "dtype", "mean", "std", "min", "max", "nan", "posinf", "neginf", "nonfinite", "has_payload"]
_WHOLE_EXPONENTS = ("e+04", "e+05", "e+06")  # what "%.4g" writes for the whole numbers from 1e4 to 1e6


def _number(value: float | None) -> str:
    if value is None:
        return ""
    if -1e6 < value < 1e6:  # the usual case (NaN and infinities fail the test)
        whole = int(value)
        return str(whole) if whole == value else f"{value:.4g}"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"  # a whole number of 1e6 or more, or a fraction past it


def _numbers(values: Sequence[float | None]) -> list[str]:
    """``[_number(v) for v in values]``, the usual case (no None) formatted by one ``%`` over the whole list."""
    try:
        text = ("\n%.4g" * len(values)) % tuple(values)
    except TypeError:  # a statistic that was not recorded (None)
        return [_number(v) for v in values]
    texts = text.split("\n")[1:]
    # "%.4g" writes what _number does (nan, inf and -inf included) but for the whole numbers from 1e4 to 1e6
    # (_number: "12345" and "999999", not "1.234e+04" and "1e+06") and for -0.0 (_number: "0", not "-0").
    if any(exponent in text for exponent in _WHOLE_EXPONENTS) or "\n-0\n" in text or text.endswith("\n-0"):
        return [_number(v) if t == "-0" or t.endswith(_WHOLE_EXPONENTS) else t for v, t in zip(values, texts)]
    return texts


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


def _node_line(node: NodeView, nonfinite: bool) -> str:
    kind = f"  [{node.module_type}]" if node.module_type and node.module_type != node.name else ""
    call = f"  (call {node.call_index})" if node.call_index else ""
    flags = "  !NaN/Inf" if nonfinite else ""
    error = f"  raised {node.error}" if node.error else ""
    return f"{_INDENT * node.depth}{node.name}{kind}{call}{flags}{error}"


def render_tree(view: TraceView) -> str:
    """The indented call tree with aligned statistics, a header and a NaN/Inf footer."""
    tensors = [tensor for node in view.nodes for tensor in node.tensors]
    any_nonfinite = any(tensor.nonfinite for tensor in tensors)
    lines: list[str | None] = [_header(view), "", None]  # None: a row of the tensor table, known once it is built
    pads: list[str] = []  # the indent of each tensor's row
    phase = "forward"
    for node in view.nodes:
        if node.phase != phase:
            phase = node.phase
            lines.append(f"{phase} pass (gradients, in the order they arrived):")
        lines.append(_node_line(node, any_nonfinite and any(t.nonfinite for t in node.tensors)))
        pad = _INDENT * (node.depth + 1)
        lines += [f"{pad}{_slot(slot)} = {text}" for slot, text in node.values]
        pads += [pad] * len(node.tensors)
        lines += [None] * len(node.tensors)
    rows = iter(_tensor_table(tensors, pads, any_nonfinite))
    text = "\n".join([next(rows) if line is None else line for line in lines] + ["", _footer(view), ""])
    return _printable(text)  # no terminal escapes from trace names


def _tensor_table(tensors: list[TensorView], pads: list[str], any_nonfinite: bool) -> list[str]:
    """The table's header row, then one row per tensor: names and shapes left-aligned, statistics right-aligned.

    Built a column at a time, and each distinct slot, shape and dtype (a trace has few) formatted once: with a
    few hundred thousand tensors, every step taken per tensor counts.
    """
    slot_text = {t.slot: _slot(t.slot) for t in tensors}
    shape_text = {t.shape: _shape(t.shape) for t in tensors}
    dtype_text = {t.dtype: (t.dtype or "?").removeprefix("torch.") for t in tensors}
    columns = [
        ["module / tensor", *[pad + slot_text[t.slot] for pad, t in zip(pads, tensors)]],
        ["shape", *[shape_text[t.shape] for t in tensors]],
        ["dtype", *[dtype_text[t.dtype] for t in tensors]],
        ["mean", *_numbers([t.mean for t in tensors])],
        ["std", *_numbers([t.std for t in tensors])],
        ["min", *_numbers([t.min for t in tensors])],
        ["max", *_numbers([t.max for t in tensors])],
        ["", *([_flag(t) for t in tensors] if any_nonfinite else [""] * len(tensors))],
    ]
    statistics = range(3, 7)
    template = "  ".join(f"%{'' if i in statistics else '-'}{max(map(len, column))}s"
                         for i, column in enumerate(columns))
    return [(template % cells).rstrip() for cells in zip(*columns)]


# Printable ASCII, tab and newline: a text of these alone is what ``printable`` returns.
_PLAIN_ASCII = bytes(range(0x20, 0x7f)) + b"\t\n"


def _printable(text: str) -> str:
    """``printable(text, keep_newlines=True)``, without its slower pass over a text of plain ASCII."""
    if text.isascii() and not text.encode("ascii").translate(None, _PLAIN_ASCII):
        return text
    return printable(text, keep_newlines=True)


def _header(view: TraceView) -> str:
    kind = "summary (statistics only)" if view.summary_only else "trace"
    if view.importer is not None:
        kind += f" imported from a dump of kind {view.importer}"
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
    """``view.to_dict()`` as strict JSON: indented by 2, with each node on a line of its own.

    One line per node keeps the output of a large trace greppable, and each
    node is turned into a dict and encoded on its own (json's fast encoder
    writes no indentation), never the whole tree at once.
    """
    header = json.dumps(strict_json_value(view.header_dict()), indent=2, allow_nan=False)
    nodes = ",\n".join(["    " + json.dumps(strict_json_value(node.to_dict()), allow_nan=False)
                        for node in view.nodes])
    body = f"\n{nodes}\n  " if nodes else ""
    return f'{header[:-2]},\n  "nodes": [{body}]\n}}'  # header is "{\n  ...\n}": nodes go in as its last key


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
