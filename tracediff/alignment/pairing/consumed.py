"""The inputs of a graph node compared only where both sides read the same point of the computation.

A graph node of B reads the outputs of other nodes: its input is the very entry of its producer's output (the
same payload: docs/trace-format.md, "Graph nodes"), so B's dataflow is known. When the call of A that a node
pairs with read exactly the output of another paired call (the same values, in any layout), while the node of
B read a value that nodes of B with no partner computed from that call's partner, the two inputs are two points
of one computation, not one tensor: llama.cpp's Gemma 3 ``Qcur_normed`` (the weight's ``MUL``) reads the
``RMS_NORM`` of ``Qcur``, transformers' ``q_norm`` reads ``q_proj``'s output. Such an input row would show the
norm, not a mistake. It is not compared: A's side of it is already compared as the other call's output
(``q_proj``'s), and what B's unpaired nodes made of it is inside the pair's computation, whose output is.

A node of B whose input came from a paired node, from the block's input or from code A runs between its calls
(the attention, which transformers computes in ``self_attn``'s own code) is compared as it read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...trace.model import Node, TensorRecord
from .evidence import Values, is_transparent, main_output, numel, same_statistics

# the most unpaired nodes of B walked back from one input: a block's nodes between two paired ones are a few
_WALK = 64


@dataclass
class Consumption:
    """B's producers by payload and the pairs of calls, to ask of each input pair what each side read."""

    pairs: tuple[tuple[Node, Node], ...]
    nodes_b: list[Node]
    values: Values
    _made_b: dict[str, Node] = field(default_factory=dict)
    _partner_a: dict[int, Node] = field(default_factory=dict)  # id of a call of A -> its call of B
    _paired_b: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        for node in self.nodes_b:
            for record in node.outputs():
                if record.payload:
                    self._made_b.setdefault(record.payload, node)
        self._partner_a = {id(a): b for a, b in self.pairs}
        self._paired_b = {id(b) for _, b in self.pairs}

    def set_aside(self, node_a: Node, node_b: Node, pairs: list[tuple[TensorRecord, TensorRecord]]
                  ) -> list[tuple[TensorRecord, TensorRecord]]:
        """The input pairs of ``(node_a, node_b)`` whose two sides are two points of one computation."""
        inputs = {id(record) for record in node_a.inputs()}
        return [(ra, rb) for ra, rb in pairs if id(ra) in inputs and self._misread(node_a, node_b, ra, rb)]

    def _misread(self, node_a: Node, node_b: Node, ra: TensorRecord, rb: TensorRecord) -> bool:
        producer = self._made_b.get(rb.payload) if rb.payload else None
        if producer is None or producer is node_b or id(producer) in self._paired_b:
            return False
        source_a = self._source_a(node_a, ra)
        if source_a is None:
            return False
        return self._computed_from(producer, self._partner_a[id(source_a)])

    def _source_a(self, node_a: Node, ra: TensorRecord) -> Node | None:
        """A paired call of A that ran before ``node_a`` in its parent and returned ``ra``'s very values."""
        stats = self.values.stats(ra, "a")
        scope = node_a.parent
        if stats is None or scope is None:
            return None
        for call in scope.walk()[1:]:
            if call is node_a or call.enter_order >= node_a.enter_order or id(call) not in self._partner_a:
                continue
            out = main_output(call)
            made = self.values.stats(out, "a") if out is not None else None
            if made is not None and numel(out) == numel(ra) and same_statistics(made, stats):
                return call
        return None

    def _computed_from(self, producer: Node, source_b: Node) -> bool:
        """Did unpaired nodes of B, ``producer`` the last of them, compute (not only view) ``source_b``'s output
        into what ``producer`` returned, on some path of B's dataflow?"""
        todo = [(producer, not is_transparent(producer, self.values, "b"))]
        seen = {id(producer)}
        while todo and len(seen) <= _WALK:
            node, computes = todo.pop()
            for record in node.inputs():
                made = self._made_b.get(record.payload) if record.payload else None
                if made is source_b:
                    if computes:
                        return True
                    continue
                if made is None or id(made) in seen or id(made) in self._paired_b:
                    continue
                seen.add(id(made))
                todo.append((made, computes or not is_transparent(made, self.values, "b")))
        return False
