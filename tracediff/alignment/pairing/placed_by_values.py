"""An exported graph whose nodes carry no module scopes, placed under the reference's modules by values and dataflow.

A graph exported with its scopes (ONNX name scopes, OpenVINO friendly names, ExecuTorch module stacks) reads as
nested calls that pair with the module calls by path (:mod:`tracediff.trace.graph_scopes`). A graph whose
scopes were stripped (an optimizer that renamed every node, a legacy export, a hand-edited model) is a flat list
of ops. Its nodes are placed under A's modules on evidence, then grouped as if the exporter had named them:

1. **values**: each call of A whose output is a floating tensor is found in B: the first node whose output has
   as many elements and the same values (relative RMS error within ``_SAME``: a float32 port's rounding is
   1e-6, a wrong value is far beyond). A call whose output is one of its inputs (a dropout) is skipped.
   Its floating inputs are found the same way.
2. **dataflow**: the call's nodes are its output node and every node that node was computed from, less the
   nodes its inputs were computed from (and those input nodes): what the call added between its inputs and
   its output.
3. each node's scopes are the calls whose nodes hold it, outermost first (A's own nesting), and B's step is
   grouped again (``"modules"`` style).

Nothing is placed unless B is a graph of the ``"modules"`` style whose nodes all lack scopes, and a node no
call holds stays at the top. The alignment says so in a warning: the pairs then rest on values, not names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ...errors import TracediffError
from ...trace.graph_scopes import GRAPH_BLOCK, group_scopes, module_scopes
from ...trace.load import Trace
from ...trace.model import Node, TensorRecord
from ...trace.payload import as_floats, is_floating

_SAME = 1e-3  # relative RMS error below which two tensors are one value (float32 noise ~1e-6, bf16 ~1e-2 beyond)


@dataclass(frozen=True)
class Placed:
    """How many of A's calls were found in B by their values, and of how many that have a floating output."""

    found: int
    calls: int

    @property
    def warning(self) -> str:
        return (f"B's graph nodes carry no module scopes: they were placed under A's modules by their values and "
                f"dataflow ({self.found} of {self.calls} calls of A found in B), so its calls pair on values, "
                "not on names")


def place_by_values(trace_a: Trace, trace_b: Trace) -> Placed | None:
    """Place B's unscoped graph nodes under A's modules, in place (see the module); None when B is not such a
    graph, or A is one itself."""
    vocabulary = trace_b.graph
    if vocabulary is None or vocabulary.scopes != "modules" or trace_a.graph is not None:
        return None
    steps = [root for root in trace_b.roots if root.children and all(_flat_node(child) for child in root.children)]
    if not steps or len(trace_a.roots) < len(steps):
        return None
    found = calls = 0
    for root_a, root_b in zip(trace_a.roots, steps):
        placed, candidates = _place_step(trace_a, root_a, trace_b, root_b)
        found, calls = found + placed, calls + candidates
    return Placed(found, calls)


def _flat_node(node: Node) -> bool:
    return node.graph and not node.children and node.module_type != GRAPH_BLOCK and not module_scopes(node)


class _Values:
    """B's node outputs by element count, read once, as float64 vectors."""

    def __init__(self, trace: Trace, nodes: list[Node]) -> None:
        self._trace = trace
        self._by_size: dict[int, list[tuple[int, TensorRecord]]] = {}
        self._read: dict[int, np.ndarray | None] = {}
        for index, node in enumerate(nodes):
            for record in node.outputs():
                if record.payload and record.shape is not None and is_floating(_dtype(record)):
                    self._by_size.setdefault(_numel(record.shape), []).append((index, record))

    def first_like(self, reference: np.ndarray, after: int = -1) -> int | None:
        """The index of the first node after ``after`` whose output holds ``reference``'s values."""
        norm = float(np.sqrt(np.mean(reference * reference))) if reference.size else 0.0
        for index, record in self._by_size.get(reference.size, ()):
            if index <= after:
                continue
            values = self._vector(record)
            if values is None:
                continue
            error = float(np.sqrt(np.mean((values - reference) ** 2)))
            if error <= _SAME * max(norm, 1e-30):
                return index
        return None

    def _vector(self, record: TensorRecord) -> np.ndarray | None:
        key = id(record)
        if key not in self._read:
            self._read[key] = _vector(self._trace, record)
        return self._read[key]


def _place_step(trace_a: Trace, root_a: Node, trace_b: Trace, root_b: Node) -> tuple[int, int]:
    nodes = list(root_b.children)
    producer = {record.payload: index for index, node in enumerate(nodes) for record in node.outputs()
                if record.payload}
    sources = [[producer[r.payload] for r in node.inputs() if r.payload in producer] for node in nodes]
    values = _Values(trace_b, nodes)
    members: dict[int, set[int]] = {}  # id(call of A) -> the indices of B's nodes it holds
    calls = list(root_a.walk())[1:]
    candidates = 0
    for call in calls:
        outputs = [r for r in call.outputs() if r.payload and is_floating(_dtype(r))]
        if not outputs:
            continue
        output = _vector(trace_a, outputs[0])
        if output is None:
            continue
        inputs = [v for v in (_vector(trace_a, r) for r in call.inputs() if r.payload and is_floating(_dtype(r)))
                  if v is not None]
        if any(v.size == output.size and np.array_equal(v, output) for v in inputs):
            continue  # returns its input: computes nothing to place
        candidates += 1
        end = values.first_like(output)
        if end is None:
            continue
        starts = [index for index in (values.first_like(v) for v in inputs) if index is not None and index < end]
        held = _ancestors([end], sources) - _ancestors(starts, sources) - set(starts)
        if held:
            members[id(call)] = held
    if not members:
        return 0, candidates
    depth = {id(call): call.depth for call in calls}
    path = {id(call): call.relative_path for call in calls}
    for index, node in enumerate(nodes):
        holding = sorted((key for key, held in members.items() if index in held), key=lambda key: depth[key])
        if holding:
            node.scopes = tuple(dict.fromkeys(path[key] for key in holding))
            node.relative_path = f"{node.scopes[-1]}.{node.relative_path}"
            node.module_path = f"{root_b.module_path}.{node.relative_path}"
    group_scopes([root_b], "modules")
    return len(members), candidates


def _ancestors(starts: Iterable[int], sources: list[list[int]]) -> set[int]:
    """``starts`` and every node they were computed from."""
    seen: set[int] = set()
    frontier = list(starts)
    while frontier:
        index = frontier.pop()
        if index in seen:
            continue
        seen.add(index)
        frontier.extend(sources[index])
    return seen


def _vector(trace: Trace, record: TensorRecord) -> np.ndarray | None:
    try:
        payload = trace.load_payload(record)
    except TracediffError:
        return None
    if not is_floating(payload.dtype):
        return None
    values = as_floats(np.asarray(payload.values), payload.dtype, np.float64).reshape(-1)
    return values if np.isfinite(values).all() else None


def _dtype(record: TensorRecord) -> str:
    return (record.dtype or "").removeprefix("torch.")


def _numel(shape: tuple[int, ...]) -> int:
    size = 1
    for n in shape:
        size *= n
    return size
