"""The recorded nodes of an ``openvino.Model``: their module scopes, dataflow and numeric attributes.

OpenVINO's PyTorch frontend names every op it converts after the module it came from:
``__module.model.layers.0.self_attn.q_proj/aten::linear/MatMul`` is the ``MatMul`` of
``model.layers.0.self_attn.q_proj``'s ``aten::linear``. Ops that OpenVINO's own transformations create
lose that prefix (``ShapeOf_10850``); such an op takes the scope of the named ops around it when every
op it reads from and every op that reads it sits in one scope (it was made inside that module), and no
scope otherwise.

What is recorded: every op whose value depends on a graph input (``Parameter``), except the shape
computations (``ShapeOf`` and the integers computed from shapes alone), which hold no value of the network;
positions (``Range``) and floating values made from shapes (the rotary embedding's angles) are recorded.
Constant subgraphs (a weight, or a float16 weight and its ``Convert``) are read as external inputs by
their names (``self.model.layers.0.self_attn.q_proj.weight``).
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

_MODULE = re.compile(r"^__module(?:\.(?P<path>[\w.]+))?/")
_NUMBERED = re.compile(r"^\d+$")
_INERT = frozenset({"Constant", "Parameter", "Result"})
_SHAPE_SOURCES = frozenset({"ShapeOf"})
#: Ops that make values of the network from shapes (the positions ``arange(seq)``): recorded, with what follows.
_VALUES_OF_SHAPES = frozenset({"Range"})
#: Ops whose attributes change numerics, and which of them (a layer norm's epsilon and its mode).
_NUMERIC_ATTRIBUTES = {"MVN": ("eps", "eps_mode", "normalize_variance"), "NormalizeL2": ("eps", "eps_mode"),
                       "Softmax": ("axis",), "Gelu": ("approximation_mode",), "ScaledDotProductAttention": ("causal",),
                       "MatMul": ("transpose_a", "transpose_b"), "Convert": ("destination_type",),
                       "ReduceMean": ("keep_dims",), "Clamp": ("min", "max"), "Elu": ("alpha",)}
_ROOTS_OF_SQRT = frozenset({"Sqrt"})


def scope_chain(module_path: str | None) -> list[str] | None:
    """The chain of module paths a node sits in, outermost first; a numbered segment joins the one before it,
    as a ``ModuleList``'s children do: ``"model.layers.0.self_attn"`` -> ``["model", "model.layers.0",
    "model.layers.0.self_attn"]``. None for no module (the root)."""
    if not module_path:
        return None
    chain: list[str] = []
    for segment in module_path.split("."):
        if chain and _NUMBERED.match(segment):
            chain[-1] = f"{chain[-1]}.{segment}"
        else:
            chain.append(f"{chain[-1]}.{segment}" if chain else segment)
    return chain


def split_friendly_name(name: str) -> tuple[str, str | None]:
    """An op's friendly name as (short name, module path): ``"__module.model.norm/aten::mul/Multiply"`` ->
    ``("Multiply", "model.norm")``; ``"ShapeOf_10850"`` -> ``("ShapeOf_10850", None)``."""
    match = _MODULE.match(name)
    path = match["path"] if match else None
    short = name.rsplit("/", 1)[-1] if match else name
    return re.sub(r"[^\w-]", "_", short) or "node", path


@dataclass
class GraphNode:
    """One recorded output of an op: its key (``friendly name:port``), what it read and where it sits."""

    key: str
    name: str
    op: str
    scope: list[str] | None
    sources: list[str]
    attributes: dict[str, Any] = field(default_factory=dict)
    output: Any = None  # the ov.Output recorded (added as a model output)


def output_key(output: Any) -> str:
    node = output.get_node()
    return f"{node.get_friendly_name()}:{output.get_index()}"


def _constant_value(node: Any) -> float | None:
    """The value of a one-element floating Constant (an epsilon, a scale), else None."""
    if node.get_type_name() != "Constant" or not node.get_output_element_type(0).is_real():
        return None
    shape = node.get_output_shape(0)
    if math.prod(shape) != 1:
        return None
    return float(node.get_data().reshape(-1)[0])


def _numeric_attributes(op: Any) -> dict[str, Any]:
    """The attributes of ``op`` that change numerics, with its one-element constant inputs and, for the
    ``Add`` under a square root (a norm's ``x.pow(2).mean() + eps``), the epsilon by name."""
    found: dict[str, Any] = {}
    kind = op.get_type_name()
    wanted = _NUMERIC_ATTRIBUTES.get(kind, ())
    if wanted:
        attributes = op.get_attributes()
        for name in wanted:
            if name in attributes:
                value = attributes[name]
                found[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
    constants = {}
    for port, value in enumerate(op.input_values()):
        number = _constant_value(value.get_node())
        if number is not None:
            constants[str(port)] = number
    if constants:
        found["constant_inputs"] = constants
        if kind == "Add" and len(constants) == 1 and any(
                target.get_node().get_type_name() in _ROOTS_OF_SQRT for target in op.output(0).get_target_inputs()):
            found["epsilon"] = next(iter(constants.values()))
    return found


def graph_nodes(ops: Sequence[Any]) -> list[GraphNode]:
    """The nodes to record of a model's ops (``get_ordered_ops()``: topological order), with scopes decided."""
    dynamic: set[int] = set()  # ops whose value depends on a Parameter
    shape_only: set[int] = set()  # ops computed from shapes alone
    for op in ops:
        kind = op.get_type_name()
        producers = [value.get_node() for value in op.input_values()]
        if kind == "Parameter":
            dynamic.add(id(op))
            continue
        live = [p for p in producers if id(p) in dynamic]
        if kind in _INERT or not live:
            continue
        dynamic.add(id(op))
        if kind in _SHAPE_SOURCES or (all(id(p) in shape_only for p in live) and kind not in _VALUES_OF_SHAPES
                                      and all(not output.get_element_type().is_real() for output in op.outputs())):
            shape_only.add(id(op))
    recorded = [op for op in ops if id(op) in dynamic and id(op) not in shape_only and op.get_type_name() not in _INERT]
    named = {id(op): scope_chain(split_friendly_name(op.get_friendly_name())[1]) for op in recorded
             if _MODULE.match(op.get_friendly_name())}
    _rescope_rewritten(recorded, named)
    scopes = _scopes_from_dataflow(recorded, named)
    _rescope_shared(recorded, scopes)
    nodes: list[GraphNode] = []
    for op in module_order(recorded, scopes):
        name, _ = split_friendly_name(op.get_friendly_name())
        sources = [output_key(value) if id(value.get_node()) in dynamic and id(value.get_node()) not in shape_only
                   and value.get_node().get_type_name() != "Parameter" else _external_name(value)
                   for value in op.input_values()]
        attributes = _numeric_attributes(op)
        attributes["openvino_name"] = op.get_friendly_name()
        for output in op.outputs():
            suffix = f"_{output.get_index()}" if op.get_output_size() > 1 else ""
            nodes.append(GraphNode(key=output_key(output), name=name + suffix, op=op.get_type_name(),
                                   scope=scopes.get(id(op)), sources=sources, attributes=dict(attributes),
                                   output=output))
    return nodes


def module_order(ops: Sequence[Any], scopes: dict[int, list[str] | None]) -> list[Any]:
    """``ops`` in a topological order in which each module's ops run together wherever the dataflow allows.

    OpenVINO's order among ops that do not depend on each other is its own: it computes the attention mask
    (scope ``model``) in the middle of layer 0's attention, and a layer's rotary angles wherever they are
    ready. Eager code runs one module call after the other, so the ops are ordered as a walk of the module
    tree: at each level, the ops of the level and the modules under it are ordered by what they read from
    each other, ties in OpenVINO's order, and each module's ops then in the same way. A level whose items
    read from each other both ways keeps OpenVINO's order.
    """
    position = {id(op): i for i, op in enumerate(ops)}
    producers = {id(op): [v.get_node() for v in op.input_values() if id(v.get_node()) in position] for op in ops}
    return _walk(list(ops), 0, scopes, position, producers)


def _walk(ops: list[Any], depth: int, scopes: dict[int, list[str] | None], position: dict[int, int],
          producers: dict[int, list[Any]]) -> list[Any]:
    def item(op: Any) -> Any:
        chain = scopes.get(id(op)) or []
        return chain[depth] if len(chain) > depth else id(op)  # a module under this level, or the op itself

    members: dict[Any, list[Any]] = {}
    for op in ops:
        members.setdefault(item(op), []).append(op)
    inside = {id(op) for op in ops}
    after: dict[Any, set[Any]] = {key: set() for key in members}
    waiting = dict.fromkeys(members, 0)
    for op in ops:
        for producer in producers[id(op)]:
            if id(producer) in inside and item(producer) != item(op) and item(op) not in after[item(producer)]:
                after[item(producer)].add(item(op))
                waiting[item(op)] += 1
    first = {key: min(position[id(op)] for op in group) for key, group in members.items()}
    ready = [(first[key], i, key) for i, key in enumerate(members) if waiting[key] == 0]
    heapq.heapify(ready)
    order: list[Any] = []
    while ready:
        *_, key = heapq.heappop(ready)
        order.append(key)
        for reader in after[key]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, (first[reader], len(order), reader))
    if len(order) != len(members):  # items that read from each other both ways: OpenVINO's own order
        return sorted(ops, key=lambda op: position[id(op)])
    ordered: list[Any] = []
    for key in order:
        group = members[key]
        if isinstance(key, str):
            ordered.extend(_walk(group, depth + 1, scopes, position, producers))
        else:
            ordered.extend(group)
    return ordered


def _external_name(value: Any) -> str:
    """A weight, a graph input or a shape, by the name a reader knows it by."""
    node = value.get_node()
    if node.get_type_name() == "Parameter":
        return value.get_any_name() if value.get_names() else node.get_friendly_name()
    return node.get_friendly_name()


def _rescope_rewritten(recorded: Sequence[Any], named: dict[int, list[str] | None]) -> None:
    """An op OpenVINO rewrote into another kind keeps the name of the op it replaced (a ``Transpose`` named
    ``.../q_norm/aten::to/Convert``: the attention's transpose merged into the norm's cast). It is placed in
    the scope its name and its inputs share (the attention), so that the module it was named after starts
    where the reference's module does."""
    for op in recorded:  # in topological order: a producer's scope is settled first
        chain = named.get(id(op))
        if not chain or _named_kind(op.get_friendly_name()) == op.get_type_name():
            continue
        for value in op.input_values():
            producer = named.get(id(value.get_node()))
            if id(value.get_node()) in named:
                chain = _common(chain, producer or [])
        named[id(op)] = chain or None


def _rescope_shared(recorded: Sequence[Any], scopes: dict[int, list[str] | None]) -> None:
    """An op read inside its own module and inside another one that does not contain it is the one op
    OpenVINO kept of several modules' identical ops (common subexpressions merged: layer 1 reads layer 0's
    ``unsqueeze`` of the rotary table): it is placed in the scope its readers share, so that it is no output
    of the module it was named after."""
    inside = {id(op) for op in recorded}
    for op in recorded:
        chain = scopes.get(id(op))
        if not chain:
            continue
        readers = [scopes.get(id(target.get_node())) or [] for output in op.outputs()
                   for target in output.get_target_inputs() if id(target.get_node()) in inside]
        own = chain[-1]
        if any(own in reader for reader in readers) and any(own not in reader for reader in readers):
            shared = chain
            for reader in readers:
                shared = _common(shared, reader)
            scopes[id(op)] = shared or None


def _named_kind(friendly_name: str) -> str:
    """The op kind a friendly name gives (``.../aten::to/Convert_1`` -> ``Convert``)."""
    return re.sub(r"_\d+$", "", friendly_name.rsplit("/", 1)[-1])


def _common(first: list[str], second: list[str]) -> list[str]:
    common: list[str] = []
    for a, b in zip(first, second):
        if a != b:
            break
        common.append(a)
    return common


def _scopes_from_dataflow(recorded: Sequence[Any], named: dict[int, list[str] | None]) -> dict[int, list[str] | None]:
    """Every recorded op's scope: its name's, or, for an op OpenVINO made, the one scope shared by the named ops
    at both ends of the unnamed ops it is linked with (it sits between two ops of that module); else None."""
    scopes: dict[int, list[str] | None] = dict(named)
    inside = {id(op) for op in recorded}
    for op in recorded:
        if id(op) in scopes:
            continue
        before = _boundary(op, named, inside, upstream=True)
        after = _boundary(op, named, inside, upstream=False)
        chains = {tuple(chain) for chain in (*before, *after) if chain}
        together = before and after and len(chains) == 1 and all(chain for chain in (*before, *after))
        scopes[id(op)] = list(next(iter(chains))) if together else None
    return scopes


def _boundary(op: Any, named: dict[int, list[str] | None], inside: set[int], *, upstream: bool
              ) -> list[list[str] | None]:
    """The scopes of the first named recorded ops reached from ``op`` through unnamed ones, up or down."""
    found: list[list[str] | None] = []
    seen = {id(op)}
    todo = [op]
    while todo and len(seen) < 64:  # a bounded walk: an unnamed op far from any module stays unscoped
        current = todo.pop()
        for neighbour in _neighbours(current, upstream):
            if id(neighbour) in seen or id(neighbour) not in inside:
                continue
            seen.add(id(neighbour))
            if id(neighbour) in named:
                found.append(named[id(neighbour)])
            else:
                todo.append(neighbour)
    return found


def _neighbours(op: Any, upstream: bool) -> Iterable[Any]:
    if upstream:
        return [value.get_node() for value in op.input_values()]
    return [target.get_node() for output in op.outputs() for target in output.get_target_inputs()]


__all__ = ["GraphNode", "graph_nodes", "module_order", "output_key", "scope_chain", "split_friendly_name"]
