"""``tracediff.show.show_trace``: the call tree of one trace, as data.

::

    from tracediff.show import show_trace

    view = show_trace("traces/port", path="**.layers.0", depth=2)
    for node in view.nodes:
        print("  " * node.depth, node.name, [t.shape for t in node.tensors])
    if view.first_nonfinite:
        print("NaN/Inf first appears in", view.first_nonfinite)

Works on every trace :func:`tracediff.load_trace` reads: tracediff's own, and
transformers' debugger's (with payloads, repr lines, or the SUMMARY file).
Statistics come from what the trace recorded, never from payloads: numeric
``stats`` in tracediff's traces, the ``mean``/``std``/``min``/``max`` strings
in transformers' (so a repr-only trace has them too). A statistic that was
not recorded is ``None``.

Rendering (tree text, JSON, CSV) lives in :mod:`tracediff.render.tree`.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .display import short_repr, summary_html
from .errors import UsageError
from .globs import matches
from .trace.frozen import frozen_builder
from .trace.load import Trace, load_trace
from .trace.model import Node, ReprValue, TensorRecord

FORMAT_VERSION = 1
_VALUE_CHARS = 80
_STATS = operator.itemgetter("mean", "std", "min", "max", "nan", "posinf", "neginf")


@dataclass(frozen=True, slots=True)
class TensorView:
    """One recorded tensor of a call: slot, shape, dtype and its recorded statistics."""

    slot: str
    order: int
    shape: tuple[int, ...] | None
    dtype: str | None
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    nan: int | None
    posinf: int | None
    neginf: int | None
    has_payload: bool

    @property
    def nonfinite(self) -> bool:
        """True when the tensor holds NaN or an infinity.

        Decided from the recorded counts when there are any, else from a
        non-finite min or max (NaN propagates into both), else from a
        non-finite mean. The mean alone is a last resort: transformers'
        debugger computes it in the tensor's dtype, so it overflows to -inf
        for an attention mask filled with the dtype's minimum.
        """
        return _nonfinite(self.nan, self.posinf, self.neginf, self.min, self.max, self.mean)

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot, "order": self.order,
            "shape": list(self.shape) if self.shape is not None else None, "dtype": self.dtype,
            "mean": self.mean, "std": self.std, "min": self.min, "max": self.max,
            "nan": self.nan, "posinf": self.posinf, "neginf": self.neginf,
            "nonfinite": self.nonfinite, "has_payload": self.has_payload,
        }


@dataclass(frozen=True, slots=True)
class NodeView:
    """One module call. ``depth`` is its depth in the trace (the root is 0); ``context`` marks an
    ancestor shown only to place the calls that matched ``path`` (its tensors and values are left out).
    Backward entries (``phase="backward"``, gradients of a call) come after the forward tree, flat, at depth 0."""

    module_path: str
    relative_path: str
    name: str
    call_index: int
    module_type: str | None
    depth: int
    tensors: tuple[TensorView, ...]
    values: tuple[tuple[str, str], ...]
    error: str | None
    context: bool = False
    phase: str = "forward"
    #: An op node (op-level capture): the qualified op name; ``module_path`` is the enclosing call's.
    op: str | None = None
    #: An op node: its ``op_index`` as recorded in the trace, the ``#N`` of ``name`` and the ``op_index`` that
    #: ``tracediff align`` reports for the op (B's; A's is in its rows' ``tensor_a``).
    op_index: int | None = None

    @property
    def nonfinite(self) -> bool:
        return any(t.nonfinite for t in self.tensors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "module_path": self.module_path, "relative_path": self.relative_path, "name": self.name,
            "call_index": self.call_index, "module_type": self.module_type, "depth": self.depth,
            "phase": self.phase, "context": self.context, "error": self.error, "nonfinite": self.nonfinite,
            "values": {slot: text for slot, text in self.values},
            "tensors": [t.to_dict() for t in self.tensors],
        } | ({"op": self.op, "op_index": self.op_index} if self.op is not None else {})


@dataclass(frozen=True)
class TraceView:
    """What ``show_trace`` returns: the (filtered) call tree of one trace, parents before children."""

    trace: str
    json_file: str
    model_name: str
    producer: str
    summary_only: bool
    complete: bool | None
    total_calls: int
    nodes: tuple[NodeView, ...]
    path: str | None = None
    depth: int | None = None
    incomplete_reason: str | None = None  # why the trace does not cover the whole forward (None: complete)
    importer: str | None = None  # the kind of dump the trace was imported from (tracediff import), None: a capture

    @property
    def tensors(self) -> list[tuple[NodeView, TensorView]]:
        """Every shown tensor with its call, in execution order."""
        return _in_order([(node, t) for node in self.nodes for t in node.tensors])

    @property
    def nonfinite(self) -> list[tuple[NodeView, TensorView]]:
        """The shown tensors holding NaN or Inf, in execution order."""
        # Filtering before the (stable) sort gives what filtering ``tensors`` gives, without sorting every tensor.
        return _in_order([(node, t) for node in self.nodes for t in node.tensors if t.nonfinite])

    @property
    def first_nonfinite(self) -> str | None:
        """``"module_path (call N) slot"`` of the first tensor holding NaN/Inf, or None."""
        found = self.nonfinite
        if not found:
            return None
        node, tensor = found[0]
        call = f" (call {node.call_index})" if node.call_index else ""
        return f"{node.module_path}{call} {tensor.slot}"

    def __repr__(self) -> str:
        return short_repr(self, trace=self.trace, model_name=self.model_name, calls=len(self.nodes),
                          total_calls=self.total_calls, complete=self.complete, first_nonfinite=self.first_nonfinite)

    def _repr_html_(self) -> str:
        facts = [("trace", self.trace), ("model", self.model_name), ("producer", self.producer),
                 ("calls shown", f"{len(self.nodes)} of {self.total_calls}"), ("complete", self.complete),
                 ("summary only", self.summary_only), ("first NaN/Inf", self.first_nonfinite)]
        return summary_html("TraceView", facts)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``format_version`` 1); NaN/Inf statistics are left as floats."""
        return self.header_dict() | {"nodes": [n.to_dict() for n in self.nodes]}

    def header_dict(self) -> dict[str, Any]:
        """``to_dict()`` without its last key, ``nodes`` (a renderer may write the nodes one at a time)."""
        return {
            "format_version": FORMAT_VERSION, "trace": self.trace, "json_file": self.json_file,
            "model_name": self.model_name, "producer": self.producer, "summary_only": self.summary_only,
            "complete": self.complete, "incomplete_reason": self.incomplete_reason,
            "total_calls": self.total_calls, "path": self.path, "depth": self.depth,
            "first_nonfinite": self.first_nonfinite, "importer": self.importer,
        }


def show_trace(path_or_trace: str | Path | Trace, *, path: str | None = None, depth: int | None = None) -> TraceView:
    """The call tree of one trace, with shapes, dtypes and recorded statistics.

    Args:
        path_or_trace: a trace folder, its JSON file, or a loaded ``Trace``.
        path: a glob on module paths (``*`` one path segment, ``**`` any number: ``'**.mlp'``),
            tried against the path relative to the root (``layers.0.mlp``) and
            the full path (``LlamaModel.layers.0.mlp``). Matching calls are
            shown with everything below them; their ancestors are kept as
            ``context`` nodes without tensors. Default: every call.
        depth: how many levels below the top to show: below the root, or
            below each matching call when ``path`` is given. ``0`` shows the
            top only. Default: no limit.

    Raises:
        TraceFormatError: the trace cannot be read.
        UsageError: ``depth`` is negative, or ``path`` matches no call (the
            message lists a few paths to try).
    """
    if depth is not None and depth < 0:
        raise UsageError(f"depth={depth}: expected 0 or more levels")
    trace = path_or_trace if isinstance(path_or_trace, Trace) else load_trace(path_or_trace)
    every = trace.nodes()
    listed = _with_ops(every)  # op nodes (op-level capture) in call order under their module call
    if path is None:
        shown = [_view(node, context=False) for node in listed if depth is None or _tree_depth(node) <= depth]
    else:
        shown = _filtered(trace, listed, path, depth)
    complete = trace.metadata.get("complete") if trace.producer == "tracediff" else None
    return TraceView(
        trace=str(trace.directory), json_file=str(trace.json_path), model_name=trace.model_name,
        producer=trace.producer, summary_only=trace.summary_only,
        complete=complete if isinstance(complete, bool) else None, total_calls=len(every),
        nodes=tuple(shown), path=path, depth=depth, incomplete_reason=trace.incomplete_reason,
        importer=trace.importer,
    )


def _with_ops(nodes: list[Node]) -> list[Node]:
    """``nodes`` with each call's op nodes placed among its children, in the order the calls and ops started."""
    if not any(node.ops for node in nodes):
        return nodes
    forward = [n for n in nodes if n.phase == "forward"]
    merged = sorted(forward + [op for n in forward for op in n.ops], key=lambda n: n.enter_order)
    return merged + [n for n in nodes if n.phase != "forward"]


def _tree_depth(node: Node) -> int:
    """A backward entry is stored flat (depth 0); count the depth of the module it belongs to."""
    if getattr(node, "phase", "forward") == "forward":
        return node.depth
    return node.relative_path.count(".") + 1 if node.relative_path else 0


def _matches(node: Node, pattern: str) -> bool:
    return matches(node.relative_path, pattern) or matches(node.module_path, pattern)


def _filtered(trace: Trace, every: list[Node], pattern: str, depth: int | None) -> list[NodeView]:
    matched = {id(node) for node in every if _matches(node, pattern)}
    if not matched:
        sample = ", ".join(n.relative_path for n in every[1:6])
        raise UsageError(f"{trace.json_path}: no module path matches {pattern!r}; paths look like: "
                         f"{sample or '(only the root)'} (globs: '**.layers.0', '**.mlp')")
    # Each shown call hangs from its shallowest matching ancestor (its anchor); ``every`` lists parents first.
    anchor_of: dict[int, Node] = {}
    for node in every:
        above = anchor_of.get(id(node.parent)) if node.parent is not None else None
        if above is not None:
            anchor_of[id(node)] = above
        elif id(node) in matched:
            anchor_of[id(node)] = node
    context: set[int] = set()
    for node in every:
        if anchor_of.get(id(node)) is node:
            parent = node.parent
            while parent is not None:
                context.add(id(parent))
                parent = parent.parent
    shown: list[NodeView] = []
    for node in every:
        anchor = anchor_of.get(id(node))
        if anchor is not None:
            if depth is None or node.depth - anchor.depth <= depth:
                shown.append(_view(node, context=False))
        elif id(node) in context:
            shown.append(_view(node, context=True))
    return shown


def _in_order(pairs: list[tuple[NodeView, TensorView]]) -> list[tuple[NodeView, TensorView]]:
    """``pairs`` sorted (stably) by the tensors' execution order; as they are when that is already the order."""
    orders = [t.order for _, t in pairs]
    if all(a <= b for a, b in zip(orders, orders[1:])):
        return pairs
    return sorted(pairs, key=lambda pair: pair[1].order)


# one view per shown call and tensor: built without the frozen ``__init__``'s per-field ``object.__setattr__``
_build_tensor_view = frozen_builder(TensorView)
_build_node_view = frozen_builder(NodeView)


def _view(node: Node, *, context: bool) -> NodeView:
    parent = node.parent
    phase = getattr(node, "phase", "forward")
    if node.op is not None:
        name = f"#{node.op_index} {node.op}"
    elif parent is None:
        name = node.module_path
    elif node.module_path.startswith(parent.module_path + "."):
        name = node.module_path[len(parent.module_path) + 1:]
    else:
        name = node.module_path
    error = None
    if node.error:
        error = f"{node.error.get('type', 'error')}: {node.error.get('message', '')}".rstrip(": ")
    if context:
        tensors: tuple[TensorView, ...] = ()
        values: tuple[tuple[str, str], ...] = ()
    else:
        tensors = tuple([_tensor_view(record) for record in node.tensors])
        values = tuple([(slot, _value_text(value)) for slot, value in node.values.items()]) if node.values else ()
    return _build_node_view(
        module_path=node.module_path, relative_path=node.relative_path, name=name, call_index=node.call_index,
        module_type=node.module_type if node.op is None else None, depth=node.depth, tensors=tensors,
        values=values, error=error, context=context, phase=phase, op=node.op, op_index=node.op_index,
    )


def _tensor_view(record: TensorRecord) -> TensorView:
    stats = record.stats
    try:
        mean, std, low, high, nan, posinf, neginf = _STATS(stats)
        usual = (type(mean) is type(std) is type(low) is type(high) is float
                 and type(nan) is type(posinf) is type(neginf) is int)
    except KeyError:
        usual = False
    if not usual:  # anything but tracediff's float statistics and int counts
        mean, std, low, high = (_number(stats.get(key)) for key in ("mean", "std", "min", "max"))
        nan, posinf, neginf = (_count(stats.get(key)) for key in ("nan", "posinf", "neginf"))
    return _build_tensor_view(slot=record.slot, order=record.order, shape=record.shape, dtype=record.dtype,
                              mean=mean, std=std, min=low, max=high, nan=nan, posinf=posinf, neginf=neginf,
                              has_payload=record.has_payload)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _nonfinite(nan: int | None, posinf: int | None, neginf: int | None,
               low: float | None, high: float | None, mean: float | None) -> bool:
    """``TensorView.nonfinite`` from the tensor's statistics."""
    if nan is not None or posinf is not None or neginf is not None:
        return bool(nan or posinf or neginf)
    if low is not None or high is not None:
        return not all(math.isfinite(v) for v in (low, high) if v is not None)
    return mean is not None and not math.isfinite(mean)


def _value_text(value: Any) -> str:
    text = str(value) if isinstance(value, ReprValue) else repr(value)
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 3] + "..."
