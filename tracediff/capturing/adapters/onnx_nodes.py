"""What each node of an exported ONNX graph records: its module scopes, name, op, dataflow and attributes.

The module chain a node was exported from comes, best first, from:

* torch's dynamo exporter (``torch.onnx.export(..., dynamo=True)``): the node's metadata
  ``pkg.torch.onnx.name_scopes``, the text of a list ``['', 'model', 'model.layers.0', ..., 'linear']``: the
  root ``''``, the module paths, and last the FX node's own name (read as a Python literal, never evaluated);
* torch's legacy exporter (``dynamo=False``): the node's name ``/model/layers.0/self_attn/q_proj/MatMul``,
  whose parts but the last are the module attributes on the way (``model``, ``model.layers.0``, ...);
* neither (a graph whose metadata was removed and whose nodes were renamed): no scope; the node is named by
  its op, and alignment pairs it by values and dataflow.

``Constant`` nodes are not recorded: their values, as initializers', are inputs from outside the trace.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

NAME_SCOPES = "pkg.torch.onnx.name_scopes"
_SCOPES_TEXT_LIMIT = 64 * 1024
_ATTRIBUTE_ITEMS = 16  # a list attribute longer than this (a big shape) is not worth a trace entry
_UNSAFE = re.compile(r"[^\w-]")
_COUNTER = re.compile(r"(?<=[^_\d])_\d+$")
#: a list of single-quoted strings without escapes, as the exporter writes module paths (compiling each
#: node's text with ``ast`` cost 3 ms a node); anything else is read by ``ast.literal_eval``
_PLAIN_LIST = re.compile(r"\[ *'[^'\\\n\r\x00]*'(?: *, *'[^'\\\n\r\x00]*')* *\]")
_PLAIN_ITEM = re.compile(r"'([^'\\\n\r\x00]*)'")
#: ops whose values come from nowhere in the trace
_NOT_RECORDED = frozenset({"Constant"})


@dataclass(frozen=True)
class PlannedOutput:
    """One output of one node, as ``record_node`` takes it (``key`` is the ONNX value name)."""

    key: str
    name: str
    op: str
    scope: tuple[str, ...] | None
    sources: tuple[str, ...]
    attributes: Mapping[str, Any] = field(default_factory=dict)


def parse_name_scopes(text: str) -> list[str] | None:
    """The list a ``pkg.torch.onnx.name_scopes`` value writes (``"['', 'model', 'linear']"``), or None when it
    is not the text of a list of strings."""
    if not isinstance(text, str) or len(text) > _SCOPES_TEXT_LIMIT:
        return None
    if _PLAIN_LIST.fullmatch(text):  # quotes and no escapes: the items are the characters between the quotes
        return _PLAIN_ITEM.findall(text)
    try:
        value = ast.literal_eval(text)  # a literal only: names, calls and attributes are refused
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return None
    return value


def scope_of(node: onnx.NodeProto) -> tuple[tuple[str, ...] | None, str | None, str]:
    """(module chain outermost first or None, the node's own short name or None, where they came from:
    ``"name_scopes"``, ``"node_name"`` or ``"none"``)."""
    for prop in node.metadata_props:
        if prop.key == NAME_SCOPES:
            scopes = parse_name_scopes(prop.value)
            if scopes:
                chain = tuple(s for s in scopes[:-1] if s)
                return chain or None, scopes[-1] or None, "name_scopes"
    if node.name.startswith("/") and node.name.count("/") >= 2:
        parts = [part for part in node.name.split("/")[1:] if part]
        if len(parts) >= 2:
            chain = tuple(".".join(parts[:i + 1]) for i in range(len(parts) - 1))
            return chain, parts[-1], "node_name"
    return None, None, "none"


def short_name(text: str | None, op: str) -> str:
    """A path-safe name segment: the exporter's name for the node less its counter, else its op.

    The exporters number names across the whole graph (``linear_4`` in one layer, ``linear_11`` in the next)
    or within a scope (``Mul_1``): without the counter every layer's nodes have the same names, and repeats
    within one scope are told apart by their call index, as repeated module calls are."""
    name = _COUNTER.sub("", _UNSAFE.sub("_", text or "")[:120])
    return name or _UNSAFE.sub("_", op) or "node"


def node_attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """The node's scalar and short-list attributes (an epsilon, an axis, a perm), and its ONNX name."""
    out: dict[str, Any] = {}
    if node.name:
        out["onnx_node"] = node.name[:200]
    if node.domain:
        out["domain"] = node.domain
    for attribute in node.attribute:
        kind = attribute.type
        if kind == 1:  # FLOAT
            out[attribute.name] = float(attribute.f)
        elif kind == 2:  # INT
            out[attribute.name] = int(attribute.i)
        elif kind == 3:  # STRING
            out[attribute.name] = attribute.s.decode("utf-8", "replace")[:200]
        elif kind == 6 and len(attribute.floats) <= _ATTRIBUTE_ITEMS:  # FLOATS
            out[attribute.name] = [float(v) for v in attribute.floats]
        elif kind == 7 and len(attribute.ints) <= _ATTRIBUTE_ITEMS:  # INTS
            out[attribute.name] = [int(v) for v in attribute.ints]
    return out


def plan_outputs(graph: onnx.GraphProto) -> tuple[list[PlannedOutput], dict[str, int]]:
    """Every recorded node output of ``graph``, in the graph's (topological) order, and how many nodes took
    their scopes from each source (``{"name_scopes": 130, "none": 7}``)."""
    planned: list[PlannedOutput] = []
    counts: dict[str, int] = {}
    seen: set[str] = set()
    nodes = list(graph.node)  # protobuf makes a new wrapper at each access: indices name the nodes
    scoped = [scope_of(node) for node in nodes]
    inferred = _scopes_from_dataflow(nodes, scoped)
    for index, node in enumerate(nodes):
        if node.op_type in _NOT_RECORDED and not node.domain:
            continue
        chain, own, source = scoped[index]
        if source == "none" and index in inferred:
            chain, source = inferred[index], "dataflow"
        counts[source] = counts.get(source, 0) + 1
        name = short_name(own if source != "none" else None, node.op_type)
        attributes = node_attributes(node)
        sources = tuple(value for value in node.input if value)
        outputs = list(node.output)
        for index, key in enumerate(outputs):
            if not key or key in seen:  # an optional output left out; a name produced twice is invalid ONNX
                continue
            seen.add(key)
            several = sum(1 for o in outputs if o) > 1
            planned.append(PlannedOutput(
                key=key, name=f"{name}_output_{index}" if several else name, op=node.op_type, scope=chain,
                sources=sources, attributes={**attributes, "output_index": index} if several else attributes))
    return planned, counts


def _scopes_from_dataflow(nodes: list[onnx.NodeProto], scoped: list[tuple[tuple[str, ...] | None, str | None, str]]
                          ) -> dict[int, tuple[str, ...]]:
    """For each node the exporter left without a scope (a ``Split`` an optimization pass made of a ``chunk``),
    the scopes all its scoped neighbours share, when it has some on both sides: the nodes that made its inputs
    and those that read its outputs. A node between two modules' nodes gets the module around both; one that
    only reads a module's output (a graph output's last op) and a graph stripped of every scope get none."""
    producer: dict[str, tuple[str, ...]] = {}
    readers: dict[str, list[tuple[str, ...]]] = {}
    for node, (chain, _, source) in zip(nodes, scoped):
        if source == "none" or not chain:
            continue
        for value in node.output:
            producer[value] = chain
        for value in node.input:
            readers.setdefault(value, []).append(chain)
    out: dict[int, tuple[str, ...]] = {}
    for index, node in enumerate(nodes):
        if scoped[index][2] != "none":
            continue
        made_from = [producer[v] for v in node.input if v in producer]
        read_by = [chain for v in node.output for chain in readers.get(v, ())]
        if not (made_from and read_by):  # between scoped nodes only: a graph output's last op stays outside
            continue
        around = made_from + read_by
        shared = around[0]
        for chain in around[1:]:
            shared = _common_prefix(shared, chain)
        if shared:
            out[index] = shared
    return out


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def marked_bytes(model: onnx.ModelProto, keys: list[str], serialized: bytes | None = None) -> bytes:
    """``model`` serialized with every value of ``keys`` among its graph outputs (Polygraphy's "mark all"):
    ONNX Runtime then returns them, and keeps them through its optimizations.

    ``serialized``: ``model.SerializeToString()``, when the caller has it. The outputs are appended as a second
    message: protobuf reads two concatenated messages as one, the repeated ``graph.output`` of the second after
    the first's, so the model (its weights) is neither copied nor serialized again."""
    import onnx

    present = {output.name for output in model.graph.output}
    extra = onnx.ModelProto(graph=onnx.GraphProto(
        output=[onnx.ValueInfoProto(name=key) for key in keys if key not in present]))
    return (serialized if serialized is not None else model.SerializeToString()) + extra.SerializeToString()


__all__ = ["NAME_SCOPES", "PlannedOutput", "marked_bytes", "node_attributes", "parse_name_scopes", "plan_outputs",
           "scope_of", "short_name"]
