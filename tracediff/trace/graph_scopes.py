"""Graph nodes read as the blocks their scopes name (docs/trace-format.md, "Graph nodes").

A graph runtime records its nodes flat under each step's top-level call, a node of a repeated block under
the block's scope: llama.cpp's ``attn_norm-0`` is ``Llama.blk.0.attn_norm``, with no call ``Llama.blk.0``
of its own. A reader that pairs calls top down (tracediff's alignment) wants the block as a call, as a
torch decoder layer is one: so when a top-level call's children are leaves and some of their paths sit
under numbered scopes (``blk.0``, ``blk.1``) that no recorded call has, each scope becomes a call
(``module_type`` ``"graph block"``):

* its children are the nodes from the first to the last node of that scope, in order (a node of no scope
  between them, a KV-cache view, belongs to the block it runs in); scopes whose spans overlap are left flat;
* its inputs are the tensors its nodes read that no node of the block produced (the hidden state coming
  in), in the order first read; its output is the output of the block's last node that a node after the
  block reads (the hidden state going out), else of its last node.

The inputs a node read from outside the trace (``{"py_type": "external"}``: a weight, the prompt) are names,
not values: they are left out of the nodes' values, so that they are not compared with the other side's.
Identity between a producer's output and a reader's input is the payload they share (a graph node's
input is written as the very entry of its producer's output). Nothing else of the trace changes.

That is the ``"blocks"`` style of a graph vocabulary (:mod:`tracediff.trace.vocabulary`). In the ``"modules"``
style (an exported graph: ONNX name scopes, OpenVINO friendly names, ExecuTorch's module stacks) a node's
scope is the chain of module paths it was exported from (its ``scopes``, else its path less the last segment,
a numbered segment joined to the one before, as a ``ModuleList``'s children are), and every level becomes
calls, nested as the modules were: under a call, each run of consecutive nodes of one child scope is one call
of it (a module called twice is two runs, two calls). A call's inputs are as above; its outputs are the
tensors its nodes produced that a node outside it reads, else those no node reads (the graph's results),
in the order produced.
"""

from __future__ import annotations

import re

from .frozen import replaced
from .model import Node, ReprValue, TensorRecord

GRAPH_BLOCK = "graph block"
_SCOPED = re.compile(r"^(?P<scope>(?:[A-Za-z_][\w-]*\.)*?[A-Za-z_][\w-]*\.\d+)\.[^.]+$")


def group_scopes(roots: list[Node], style: str = "blocks") -> None:
    """Group the scoped graph nodes of every top-level call into calls, in place (idempotent): llama.cpp's
    numbered blocks (``style="blocks"``) or an exported graph's modules (``"modules"``)."""
    for root in roots:
        children = root.children
        if not children or any(child.children or child.module_type == GRAPH_BLOCK for child in children):
            continue
        if style == "modules":
            if any(child.graph for child in children):
                _drop_external_values(children)
                _group_modules(root, children)
            continue
        if not any(child.relative_path and _scope(child, root) for child in children):
            continue
        _drop_external_values(children)
        spans = _spans(children, root)
        if spans is None:
            continue
        grouped: list[Node] = []
        position = 0
        for scope, (first, last) in spans:
            grouped.extend(children[position:first])
            grouped.append(_block(root, scope, children[first:last + 1], children[last + 1:]))
            position = last + 1
        grouped.extend(children[position:])
        root.children = grouped


def _drop_external_values(children: list[Node]) -> None:
    """What a node read from outside the trace (a weight) is named, not a value to compare."""
    for child in children:
        child.values = {slot: value for slot, value in child.values.items()
                        if not (slot.startswith("inputs") and isinstance(value, ReprValue))}


def _scope(node: Node, root: Node) -> str | None:
    path = node.relative_path
    match = _SCOPED.match(path)
    return match["scope"] if match is not None else None


def _spans(children: list[Node], root: Node) -> list[tuple[str, tuple[int, int]]] | None:
    """Each scope's first and last child, in order; None when two spans overlap."""
    spans: dict[str, list[int]] = {}
    for index, child in enumerate(children):
        scope = _scope(child, root)
        if scope is not None:
            spans.setdefault(scope, [index, index])[1] = index
    ordered = sorted(spans.items(), key=lambda item: item[1][0])
    for (_, (_, end)), (_, (start, _)) in zip(ordered, ordered[1:]):
        if start <= end:
            return None
    return [(scope, (first, last)) for scope, (first, last) in ordered]


def _block(root: Node, scope: str, members: list[Node], after: list[Node]) -> Node:
    counts = sum(1 for child in root.children if child.module_type == GRAPH_BLOCK and child.relative_path == scope)
    block = Node(module_path=f"{root.module_path}.{scope}", relative_path=scope, call_index=counts,
                 module_type=GRAPH_BLOCK, depth=root.depth + 1, enter_order=members[0].enter_order,
                 exit_order=members[-1].exit_order, parent=root, has_outputs=True, phase=root.phase)
    produced = {record.payload for member in members for record in member.outputs() if record.payload}
    read_after = {record.payload for node in after for record in node.inputs() if record.payload}
    inputs = _inputs_from_outside(members, produced)
    result = next((member for member in reversed(members)
                   if any(record.payload in read_after for record in member.outputs())), members[-1])
    outputs = [replaced(record, slot="outputs" + record.slot[len("outputs"):])
               for record in result.outputs()]
    block.tensors = inputs + outputs
    for member in members:
        member.parent = block
        for node in member.walk():
            node.depth += 1
    block.children = list(members)
    return block


_NUMBERED = re.compile(r"^\d+$")


def module_scopes(node: Node) -> tuple[str, ...]:
    """A graph node's module chain, outermost first: its recorded ``scopes``, else its path less the last segment
    as the chain of its prefixes (``model.layers.0.mlp.Mul`` -> ``model``, ``model.layers.0``,
    ``model.layers.0.mlp``: a numbered segment joins the one before, as a ``ModuleList``'s children do)."""
    if node.scopes:
        return node.scopes
    parts = node.relative_path.split(".")[:-1]
    chain: list[str] = []
    for part in parts:
        if chain and _NUMBERED.match(part):
            chain[-1] = f"{chain[-1]}.{part}"
        else:
            chain.append(f"{chain[-1]}.{part}" if chain else part)
    return tuple(chain)


def _group_modules(root: Node, members: list[Node]) -> None:
    """Group ``root``'s graph nodes ``members`` by their module chains, level by level (see the module)."""
    readers: dict[str, set[int]] = {}
    for member in members:
        for record in member.inputs():
            if record.payload:
                readers.setdefault(record.payload, set()).add(id(member))
    _group_level(root, root, members, 0, readers, {})


def _group_level(root: Node, call: Node, members: list[Node], level: int, readers: dict[str, set[int]],
                 counts: dict[str, int]) -> None:
    """Make ``call``'s children: each run of consecutive ``members`` of one scope at ``level`` a call of that
    scope (grouped again below), the members of no deeper scope as they are."""
    chains = [module_scopes(member) for member in members]
    children: list[Node] = []
    position = 0
    while position < len(members):
        chain = chains[position]
        if len(chain) <= level:
            children.append(members[position])
            position += 1
            continue
        scope, end = chain[level], position + 1
        while end < len(members) and len(chains[end]) > level and chains[end][level] == scope:
            end += 1
        run = members[position:end]
        block = _module_call(root, call, scope, run, readers, counts)
        _group_level(root, block, run, level + 1, readers, counts)
        children.append(block)
        position = end
    call.children = children


def _module_call(root: Node, parent: Node, scope: str, members: list[Node], readers: dict[str, set[int]],
                 counts: dict[str, int]) -> Node:
    path = f"{root.module_path}.{scope}"
    block = Node(module_path=path, relative_path=scope, call_index=counts.get(path, 0), module_type=GRAPH_BLOCK,
                 depth=parent.depth + 1, enter_order=members[0].enter_order, exit_order=members[-1].exit_order,
                 parent=parent, has_outputs=True, phase=root.phase)
    counts[path] = block.call_index + 1
    inside = {id(member) for member in members}
    produced: dict[str, TensorRecord] = {}
    for member in members:
        for record in member.outputs():
            if record.payload:
                produced.setdefault(record.payload, record)
    inputs = _inputs_from_outside(members, set(produced))
    read_outside = [record for payload, record in produced.items() if readers.get(payload, set()) - inside]
    results = read_outside or [record for payload, record in produced.items() if not readers.get(payload)]
    if not results:
        results = members[-1].outputs()
    outputs = [replaced(record, slot="outputs" if len(results) == 1 else f"outputs.{i}")
               for i, record in enumerate(results)]
    block.tensors = inputs + outputs
    for member in members:
        member.parent = block
        member.depth += 1
    block.children = list(members)
    return block


def _inputs_from_outside(members: list[Node], produced: set[str]) -> list[TensorRecord]:
    """The tensors ``members`` read that none of them produced, in the order first read, as a call's inputs."""
    inputs: list[TensorRecord] = []
    seen: set[str] = set()
    for member in members:
        for record in member.inputs():
            if record.payload and record.payload not in produced and record.payload not in seen:
                seen.add(record.payload)
                inputs.append(replaced(record, slot=f"inputs.args.{len(inputs)}"))
    return inputs
