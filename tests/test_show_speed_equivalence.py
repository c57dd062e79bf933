"""The fast paths of ``show_trace`` and ``render_tree`` give what the plain code they replaced gave.

``show.py`` builds ``TensorView``/``NodeView`` without their frozen ``__init__`` (through
``tracediff.trace.frozen.frozen_builder``) and reads tracediff's statistics at once; ``render_tree`` formats
the statistics a column at a time with ``%.4g`` and skips ``printable``'s regex pass over plain ASCII. Each is
checked here against the straightforward version, on statistics and names chosen to hit every branch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from typing import Any

import pytest

from tracediff.render.strict_json import strict_json_value
from tracediff.render.text import printable
from tracediff.render.tree import (
    _flag,
    _header,
    _number,
    _numbers,
    _printable,
    _shape,
    _slot,
    render_json,
    render_tree,
)
from tracediff.show import NodeView, TensorView, TraceView, _tensor_view, _view
from tracediff.trace.model import Node, ReprValue, TensorRecord

nan, inf = math.nan, math.inf

STATS: list[dict[str, Any]] = [
    {"numel": 4, "mean": 0.5, "std": 1.25, "min": -3.5, "max": 3.5, "nan": 0, "posinf": 0, "neginf": 0},
    {"mean": nan, "std": nan, "min": nan, "max": nan, "nan": 2, "posinf": 0, "neginf": 1},
    {"mean": inf, "std": 0.0, "min": -inf, "max": inf, "nan": 0, "posinf": 3, "neginf": 0},
    {"mean": 1.0, "std": 2.0, "min": 0.0, "max": 4.0},  # no counts (transformers' traces)
    {"mean": -inf, "std": 1.0},  # no bounds: the mean decides
    {"mean": -inf},
    {"min": 1.0, "max": inf},
    {},
    {"mean": 3, "std": 1, "min": -2, "max": 12345, "nan": 0.0, "posinf": 1.0, "neginf": nan},  # ints, float counts
    {"mean": True, "std": "1.0", "min": None, "max": 2.5, "nan": False, "posinf": None, "neginf": 0},
    {"mean": 1e6, "std": -0.0, "min": -999999.0, "max": 65504.0, "nan": 0, "posinf": 0, "neginf": 0},
]


def _old_tensor_view(record: TensorRecord) -> TensorView:
    """The code ``_tensor_view`` replaced (constructs through ``TensorView.__init__``)."""
    stats = record.stats

    def number(key: str) -> float | None:
        value = stats.get(key)
        return float(value) if isinstance(value, (int, float)) else None

    def count(key: str) -> int | None:
        value = stats.get(key)
        return int(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    return TensorView(slot=record.slot, order=record.order, shape=record.shape, dtype=record.dtype,
                      mean=number("mean"), std=number("std"), min=number("min"), max=number("max"),
                      nan=count("nan"), posinf=count("posinf"), neginf=count("neginf"), has_payload=record.has_payload)


def _old_nonfinite(t: TensorView) -> bool:
    """The ``TensorView.nonfinite`` property as it was first written."""
    counts = [c for c in (t.nan, t.posinf, t.neginf) if c is not None]
    if counts:
        return any(counts)
    bounds = [v for v in (t.min, t.max) if v is not None]
    if bounds:
        return not all(math.isfinite(v) for v in bounds)
    return t.mean is not None and not math.isfinite(t.mean)


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN (a dataclass's ``==`` compares NaN fields as unequal unless the same object)."""
    return repr(a) == repr(b) and [type(v) for v in a.to_dict().values()] == [type(v) for v in b.to_dict().values()]


def _record(stats: dict[str, Any], order: int = 0, slot: str = "outputs") -> TensorRecord:
    return TensorRecord(slot=slot, order=order, shape=(2, 3), dtype="torch.float32", stats=stats,
                        payload="p.safetensors" if order % 2 else None)


@pytest.mark.parametrize("stats", STATS)
def test_tensor_views_built_fast_are_those_init_builds(stats: dict[str, Any]) -> None:
    record = _record(stats, order=1)
    fast, plain = _tensor_view(record), _old_tensor_view(record)
    assert type(fast) is TensorView and _same(fast, plain)
    assert fast.nonfinite is plain.nonfinite is _old_nonfinite(plain)
    assert fast.to_dict()["nonfinite"] is _old_nonfinite(plain)
    # every slot is set (an unset one would raise AttributeError), and the fast one is as frozen
    for f in dataclasses.fields(TensorView):
        getattr(fast, f.name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.mean = 1.0  # type: ignore[misc]
    if not any(isinstance(v, float) and math.isnan(v) for v in stats.values()):
        assert fast == plain and hash(fast) == hash(plain)
    assert dataclasses.replace(fast, nan=5).nonfinite is True


def test_the_builders_have_every_field() -> None:
    assert TensorView.__slots__ == tuple(f.name for f in dataclasses.fields(TensorView))
    assert NodeView.__slots__ == tuple(f.name for f in dataclasses.fields(NodeView))
    node = Node(module_path="M.layers.0", relative_path="layers.0", call_index=2, module_type="Block", depth=1,
                enter_order=0, tensors=[_record(s, order=i) for i, s in enumerate(STATS)],
                values={"inputs.kwargs.flag": True, "inputs.kwargs.text": ReprValue("x" * 100)},
                error={"type": "ValueError", "message": "bad"})
    node.parent = Node(module_path="M", relative_path="", call_index=0, module_type="M", depth=0, enter_order=0)
    for context in (False, True):
        fast = _view(node, context=context)
        assert type(fast) is NodeView
        for f in dataclasses.fields(NodeView):
            getattr(fast, f.name)  # set
        plain = NodeView(**{f.name: getattr(fast, f.name) for f in dataclasses.fields(NodeView)})
        assert repr(fast) == repr(plain) and fast.nonfinite is plain.nonfinite
        assert fast.to_dict().keys() == plain.to_dict().keys()
        with pytest.raises(dataclasses.FrozenInstanceError):
            fast.name = "x"  # type: ignore[misc]
    assert [t.order for t in _view(node, context=False).tensors] == list(range(len(STATS)))
    assert _view(node, context=False).values == (("inputs.kwargs.flag", "True"),
                                                 ("inputs.kwargs.text", "x" * 77 + "..."))


def _old_number(value: float | None) -> str:
    if value is None:
        return ""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.4g}"


NUMBERS = [0.0, -0.0, 1.0, -1.0, 0.5, 3.5, -3.5, 1e-5, -1e-5, 1234.0, 9999.0, 9999.5, 10000.0, 12345.0, -12345.0,
           12345.6, 99999.0, 123456.0, -999999.0, 999999.5, 1e6, -1e6, 1234567.0, 1e300, -1e-300, 5e-324, nan, -nan,
           inf, -inf, 65504.0, -65504.0, 3.4028234663852886e38, 0.1 + 0.2, 2.0 ** 53, 7, -7, 123456]


def test_numbers_are_written_as_number_writes_them() -> None:
    for value in [*NUMBERS, None]:
        assert _number(value) == _old_number(value), value
    assert _numbers(NUMBERS) == [_old_number(v) for v in NUMBERS]
    assert _numbers([*NUMBERS, None]) == [_old_number(v) for v in [*NUMBERS, None]]
    for value in NUMBERS:  # one at a time: the "-0" at the end of the text, no fix-up needed, ...
        assert _numbers([value]) == [_old_number(value)], value
    assert _numbers([]) == []


def test_numbers_agree_on_many_magnitudes() -> None:
    rng = random.Random(0)
    values = [rng.choice([-1, 1]) * 10 ** rng.uniform(-8, 9) for _ in range(20000)]
    values += [float(rng.randint(-1_100_000, 1_100_000)) for _ in range(20000)]
    values += [float(rng.randint(-10, 10) + k) for k in (1e4, 1e5, 1e6, -1e4, -1e5, -1e6, 999_950, -999_950)
               for _ in range(50)]
    values += [round(v, rng.randint(0, 3)) for v in values[:5000]]
    assert _numbers(values) == [_old_number(v) for v in values]


@pytest.mark.parametrize("text", [
    "plain ascii\twith tabs\nand lines", "", "\x1b[2J", "bell\x07", "del\x7f", "c1 \x9b", "bidi \u202e", "é ünïcode",
    "lone \udc80", "\x1b]0;owned\x07\udc80", "\x0b\x0c\r", "tab\t\n",
])
def test_printable_fast_path_changes_nothing(text: str) -> None:
    assert _printable(text) == printable(text, keep_newlines=True)


def _old_render_tree(view: TraceView) -> str:
    """The ``render_tree`` that building the table column by column replaced."""
    lines: list[tuple[str, list[str] | None]] = []
    phase = "forward"
    for node in view.nodes:
        if node.phase != phase:
            phase = node.phase
            lines.append((f"{phase} pass (gradients, in the order they arrived):", None))
        kind = f"  [{node.module_type}]" if node.module_type and node.module_type != node.name else ""
        call = f"  (call {node.call_index})" if node.call_index else ""
        flags = "  !NaN/Inf" if any(_old_nonfinite(t) for t in node.tensors) else ""
        error = f"  raised {node.error}" if node.error else ""
        lines.append((f"{'  ' * node.depth}{node.name}{kind}{call}{flags}{error}", None))
        pad = "  " * (node.depth + 1)
        for slot, text in node.values:
            lines.append((f"{pad}{_slot(slot)} = {text}", None))
        for t in node.tensors:
            cells = [_shape(t.shape), (t.dtype or "?").removeprefix("torch."), _old_number(t.mean),
                     _old_number(t.std), _old_number(t.min), _old_number(t.max), _flag(t)]
            lines.append((f"{pad}{_slot(t.slot)}", cells))
    headers = ["shape", "dtype", "mean", "std", "min", "max", ""]
    first_width = max([len(text) for text, cells in lines if cells is not None] + [len("module / tensor")])
    widths = [len(h) for h in headers]
    for _, stats in lines:
        if stats is not None:
            widths = [max(w, len(c)) for w, c in zip(widths, stats)]

    def row(first: str, cells: list[str]) -> str:
        parts = [first.ljust(first_width)] + [c.rjust(w) if 2 <= i < 6 else c.ljust(w)
                                              for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(parts).rstrip()

    out = [_header(view), "", row("module / tensor", headers)]
    out += [row(text, cells) if cells is not None else text for text, cells in lines]
    found = sorted([(n, t) for n in view.nodes for t in n.tensors if _old_nonfinite(t)], key=lambda p: p[1].order)
    if found:
        node, tensor = found[0]
        where = f"{node.module_path}{f' (call {node.call_index})' if node.call_index else ''} {tensor.slot}"
        out += ["", f"{len(found)} shown tensor(s) hold NaN/Inf; the first is {where}"]
    else:
        out += ["", "no NaN/Inf in the shown tensors"]
    return printable("\n".join(out), keep_newlines=True) + "\n"


def _trace_view(nodes: list[NodeView]) -> TraceView:
    return TraceView(trace="t", json_file="t/x.json", model_name="M", producer="tracediff", summary_only=False,
                     complete=True, total_calls=len(nodes), nodes=tuple(nodes))


def _tensors(stats: list[dict[str, Any]], first_order: int, slots: list[str], shapes: list[Any],
             dtypes: list[Any]) -> tuple[TensorView, ...]:
    return tuple(_old_tensor_view(TensorRecord(slot=slots[i % len(slots)], order=first_order - i,
                                               shape=shapes[i % len(shapes)], dtype=dtypes[i % len(dtypes)],
                                               stats=s))
                 for i, s in enumerate(stats))


@pytest.mark.parametrize("stats", [STATS, STATS[:1], [STATS[0], STATS[3]], STATS[7:8], []])
def test_the_tree_is_the_one_the_plain_renderer_wrote(stats: list[dict[str, Any]]) -> None:
    slots = ["outputs", "inputs.args.0", "inputs.kwargs.x\u2003", "grad_inputs.0", "odd\x1b[2J"]
    shapes = [(2, 3), (), None, (1,)]
    dtypes = ["torch.float32", None, "bfloat16"]
    nodes = [
        NodeView(module_path="M", relative_path="", name="M", call_index=0, module_type="M", depth=0,
                 tensors=_tensors(stats, 100, slots, shapes, dtypes), values=(("inputs.kwargs.n", "3"),), error=None),
        NodeView(module_path="M.a%s", relative_path="a%s", name="a%s", call_index=1, module_type="Lin\u00e9ar",
                 depth=1, tensors=_tensors(stats[::-1], 50, slots[1:], shapes[1:], dtypes[1:]), values=(),
                 error="ValueError: x"),
        NodeView(module_path="M.b", relative_path="b", name="b", call_index=0, module_type=None, depth=1,
                 tensors=(), values=(), error=None, context=True),
        NodeView(module_path="M.a%s", relative_path="a%s", name="M.a%s", call_index=0, module_type="Lin", depth=0,
                 tensors=_tensors(stats[:2], 200, ["grad_outputs.0"], [(4,)], ["torch.float16"]), values=(),
                 error=None, phase="backward"),
    ]
    view = _trace_view(nodes)
    assert render_tree(view) == _old_render_tree(view)
    assert render_tree(_trace_view([])) == _old_render_tree(_trace_view([]))
    # JSON is written a node at a time, a line each: the same document as dumping the whole dict
    for shown in (view, _trace_view([]), _trace_view(nodes[:1])):
        text = render_json(shown)
        assert json.loads(text) == json.loads(json.dumps(strict_json_value(shown.to_dict()), allow_nan=False))
        lines = len(shown.header_dict()) + (4 + len(shown.nodes) if shown.nodes else 3)  # { keys "nodes": [ ] }
        assert len(text.splitlines()) == lines


def test_nonfinite_tensors_in_execution_order() -> None:
    stats = [STATS[1], STATS[0], STATS[2], STATS[5], STATS[1]]
    a = NodeView(module_path="M", relative_path="", name="M", call_index=0, module_type="M", depth=0,
                 tensors=_tensors(stats, 9, ["outputs"], [(1,)], ["f"]), values=(), error=None)
    b = NodeView(module_path="M.x", relative_path="x", name="x", call_index=0, module_type="X", depth=1,
                 tensors=_tensors(stats, 3, ["outputs"], [(1,)], ["f"]), values=(), error=None)
    view = _trace_view([a, b])
    everything = sorted([(n, t) for n in view.nodes for t in n.tensors], key=lambda p: p[1].order)
    assert view.tensors == everything
    assert view.nonfinite == [(n, t) for n, t in everything if _old_nonfinite(t)]
    assert view.first_nonfinite == "M.x outputs"
    in_order = _trace_view([b])
    assert [t.order for _, t in in_order.tensors] == sorted(t.order for t in b.tensors)
