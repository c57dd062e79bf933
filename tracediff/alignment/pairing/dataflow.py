"""Which op of A pairs with which op of B inside one matched module call: by dataflow and values.

Two implementations of the same math may compute it in another order (``rotate_half(q) * sin + q * cos``
against ``q * cos + rotate_half(q) * sin``): the ``mul`` ops of the two sides then compute different
intermediates, and comparing them op by op would report a divergence that is not there. So ops pair by what
flows into them, in B's call order, in four passes:

1. **Dataflow**: an op of B pairs with an unpaired op of A of the same short name (``softmax`` for
   ``torch.softmax`` and ``torch.nn.functional.softmax``) whose tensor inputs are *linked* to its own, one to
   one in any order: the same tensor on both sides (the tensor identity of a payload: a module input, a
   submodule's output, the output of an op paired before) or, for a tensor with no link (a view made by code
   that is not recorded), the same values (compatible shapes, :meth:`Values.similarity` of 1, then the
   values within tolerance). Among
   several, the one whose output agrees wins. Such a pair is kept even when its outputs differ: that is
   where a divergence is introduced (a wrong ``scale=``). Otherwise, an op whose output agrees in value with
   an output of an unpaired op of A pairs with it by value: that is where two orders of the same math meet.
2. **Sequence**, for the ops that pass 1 left and whose results never reach a pair of pass 1 (what reaches one
   is an intermediate of another order of the same math, listed as unmatched): the op the two op sequences
   align (by name and shapes, then by name) or, failing that, an op of the same name sharing a linked input,
   unless an input of B's op is linked to a tensor that A's op does not take. This is how a bug shows at the
   op that reads the wrong tensor (``k`` left unrotated: ``q @ k^T`` reads another ``k``).
3. **Feeding**: an op of B still unpaired that reads only tensors paired with A's, and whose output is an
   input of an op paired in pass 2 (itself, or an unrecorded view of it, reshaped or transposed), pairs its
   output with A's tensor at that input (the op that made a NaN from finite inputs is named, not the op that
   read it; a GQA ``repeat`` in the wrong head order, not the ``q @ k^T`` that reads it transposed).
4. **Last output**: each op of B still unpaired, from the last, takes the latest unpaired output of A of a
   compatible shape between the neighbouring pairs (a fused ``scaled_dot_product_attention`` that computes
   something else than A's ``matmul`` + ``softmax`` + ``matmul`` shows as one diverged row).

What is left on either side is unmatched. ``VALUE_COMPARISONS`` bounds the payload comparisons of one call.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher

from ...compare.shapes import squeezable
from ...trace.model import Node, TensorRecord
from .evidence import Values, numel, same_statistics

#: At most this many payload comparisons by value in one module call (two unrelated op sequences of a few
#: hundred same-shaped ops would otherwise compare every pair).
VALUE_COMPARISONS = 1024

Agrees = Callable[[TensorRecord, TensorRecord], bool]
Pairs = list[tuple[TensorRecord, TensorRecord]]


@dataclass
class OpPair:
    """Two ops paired, how (``dataflow``, ``sequence``, ``value``, ``feeding``), and the tensors to compare.

    ``tensors`` are (A's record, B's record); for ``feeding`` A's record belongs to ``op_a``, the op of A
    whose input it is."""

    op_a: Node
    op_b: Node
    how: str
    tensors: Pairs


@dataclass
class Links:
    """Which tensor of B is which tensor of A, by tensor identity (payload names): seeded with the pairs of
    module tensors, grown with the outputs of every op pair."""

    b_to_a: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    linked_a: set[str] = field(default_factory=set)

    def add(self, ra: TensorRecord, rb: TensorRecord) -> None:
        if ra.payload is not None and rb.payload is not None:
            self.b_to_a[rb.payload].add(ra.payload)
            self.linked_a.add(ra.payload)

    def known(self, rb: TensorRecord) -> bool:
        return rb.payload is not None and rb.payload in self.b_to_a

    def same(self, ra: TensorRecord, rb: TensorRecord) -> bool:
        return ra.payload is not None and rb.payload is not None and ra.payload in self.b_to_a.get(rb.payload, ())


def short_name(op: Node) -> str:
    """``softmax`` for ``torch.softmax``, ``torch.nn.functional.softmax`` and ``torch.Tensor.softmax`` alike."""
    return (op.op or "").rsplit(".", 1)[-1].strip("_")


def compatible(ra: TensorRecord, rb: TensorRecord) -> bool:
    """Equal shapes, or equal once dimensions of size 1 are dropped."""
    if ra.shape is None or rb.shape is None:
        return False
    return ra.shape == rb.shape or squeezable(ra.shape, rb.shape)


class _Call:
    """The op pairing of one matched module call (see the module docstring)."""

    def __init__(self, ops_a: list[Node], ops_b: list[Node], links: Links, values: Values, agrees: Agrees) -> None:
        self.ops_a, self.ops_b, self.links, self.values, self.agrees = ops_a, ops_b, links, values, agrees
        self.partner_a: dict[int, int] = {}  # index in ops_a -> index in ops_b
        self.partner_b: dict[int, int] = {}
        self.pairs: list[OpPair] = []
        self.budget = VALUE_COMPARISONS
        self.equal: dict[tuple[int, int], bool] = {}
        self.meeting: dict[tuple[int, int], bool] = {}

    # --- evidence ---------------------------------------------------------------------------------------------

    def linked(self, ra: TensorRecord, rb: TensorRecord) -> bool:
        """The same tensor, or, for two tensors without a link, the same values in a compatible shape."""
        if self.links.known(rb) or (ra.payload is not None and ra.payload in self.links.linked_a):
            return self.links.same(ra, rb)
        key = (id(ra), id(rb))
        if key not in self.equal:  # the statistics first (cheap), then the values under the tolerance
            self.equal[key] = compatible(ra, rb) and self.values.similarity(ra, rb) >= 1.0 and \
                self.agrees(ra, rb)
        return self.equal[key]

    def matched_inputs(self, op_a: Node, op_b: Node) -> Pairs | None:
        """Every tensor input of ``op_b`` linked to one of ``op_a``'s, one to one; None when they are not."""
        inputs_a, inputs_b = op_a.inputs(), op_b.inputs()
        if len(inputs_a) != len(inputs_b):
            return None
        out: Pairs = []
        free = list(inputs_a)
        for rb in inputs_b:
            ra = next((x for x in free if self.linked(x, rb)), None)
            if ra is None:
                return None
            free.remove(ra)
            out.append((ra, rb))
        return out

    def contradicts(self, op_a: Node, op_b: Node) -> bool:
        """An input of ``op_b`` is a tensor of A that ``op_a`` does not take."""
        payloads_a = {r.payload for r in op_a.inputs()}
        return any(rb.payload is not None and rb.payload in self.links.b_to_a
                   and not self.links.b_to_a[rb.payload] & payloads_a for rb in op_b.inputs())

    # --- bookkeeping ------------------------------------------------------------------------------------------

    def pair(self, i: int, j: int, how: str, tensors: Pairs) -> None:
        self.partner_a[i], self.partner_b[j] = j, i
        self.pairs.append(OpPair(self.ops_a[i], self.ops_b[j], how, tensors))
        if how != "feeding":
            for ra, rb in tensors:
                if rb.slot.startswith("outputs"):
                    self.links.add(ra, rb)

    def free_a(self, short: str | None = None) -> list[int]:
        return [i for i, op in enumerate(self.ops_a)
                if i not in self.partner_a and (short is None or short_name(op) == short)]

    @staticmethod
    def outputs_by_slot(op_a: Node, op_b: Node) -> Pairs:
        by_slot = {r.slot: r for r in op_a.outputs()}
        return [(by_slot[rb.slot], rb) for rb in op_b.outputs() if rb.slot in by_slot]

    def all_tensors(self, op_a: Node, op_b: Node) -> Pairs:
        """Inputs linked first, then by slot, then in order among compatible shapes; outputs by slot."""
        free_a, out = list(op_a.inputs()), []
        rest_b = []
        for rb in op_b.inputs():
            ra = next((x for x in free_a if self.links.same(x, rb)), None)
            if ra is None:
                rest_b.append(rb)
                continue
            free_a.remove(ra)
            out.append((ra, rb))
        for rb in list(rest_b):
            ra = next((x for x in free_a if x.slot == rb.slot), None) or \
                next((x for x in free_a if compatible(x, rb)), None)
            if ra is not None:
                free_a.remove(ra)
                out.append((ra, rb))
        return out + self.outputs_by_slot(op_a, op_b)

    # --- the passes -------------------------------------------------------------------------------------------

    def by_dataflow(self) -> None:
        for j, op_b in enumerate(self.ops_b):
            found = [(i, inputs) for i in self.free_a(short_name(op_b))
                     if (inputs := self.matched_inputs(self.ops_a[i], op_b)) is not None]
            if found:
                i, inputs = next(((i, x) for i, x in found if len(found) == 1 or self.outputs_agree(i, op_b)),
                                 found[0])
                self.pair(i, j, "dataflow", inputs + self.outputs_by_slot(self.ops_a[i], op_b))
            else:
                self.by_value(j)

    def outputs_agree(self, i: int, op_b: Node) -> bool:
        op_a = self.ops_a[i]
        return all(self.agrees(ra, rb) for ra, rb in self.outputs_by_slot(op_a, op_b))

    def by_value(self, j: int) -> None:
        op_b = self.ops_b[j]
        for rb in op_b.outputs():
            for i in self.free_a():
                op_a = self.ops_a[i]
                for ra in op_a.outputs():
                    if self.budget <= 0 or not compatible(ra, rb):
                        continue
                    self.budget -= 1
                    if self.agrees(ra, rb):
                        self.pair(i, j, "value", [(ra, rb)])
                        return

    def meets(self, i: int, j: int) -> bool:
        """The pair (``i`` of A, ``j`` of B) is where results agree: paired by value, or its outputs agree."""
        key = (i, j)
        if key not in self.meeting:
            how = next(p.how for p in self.pairs if p.op_a is self.ops_a[i] and p.op_b is self.ops_b[j])
            self.meeting[key] = how == "value" or self.outputs_agree(i, self.ops_b[j])
        return self.meeting[key]

    def reaching(self, ops: list[Node], partner: dict[int, int], side: str) -> set[int]:
        """The unpaired ops whose results flow, through unpaired ops only, into a pair where results agree."""
        consumers: dict[str, list[int]] = defaultdict(list)
        for k, op in enumerate(ops):
            for r in op.inputs():
                if r.payload is not None:
                    consumers[r.payload].append(k)
        reach: set[int] = set()
        for k in reversed(range(len(ops))):  # consumers run later: decided before their producers
            if k in partner:
                continue
            nexts = {c for r in ops[k].outputs() if r.payload is not None for c in consumers[r.payload] if c > k}
            if any(c in reach or c in partner and self.meets(*((c, partner[c]) if side == "a" else (partner[c], c)))
                   for c in nexts):
                reach.add(k)
        return reach

    def by_sequence(self) -> None:
        absorbed_a = self.reaching(self.ops_a, self.partner_a, "a")
        absorbed_b = self.reaching(self.ops_b, self.partner_b, "b")
        aligned = dict((j, i) for i, j in _aligned(self.ops_a, self.ops_b))
        for j, op_b in enumerate(self.ops_b):
            if j in self.partner_b or j in absorbed_b:
                continue
            usable = [i for i in self.free_a(short_name(op_b))
                      if i not in absorbed_a and not self.contradicts(self.ops_a[i], op_b)]
            i = aligned.get(j)
            if i not in usable:
                shared = [(sum(self.links.same(ra, rb) for ra in self.ops_a[k].inputs() for rb in op_b.inputs()), -k)
                          for k in usable]
                best = max(shared, default=(0, 0))
                i = -best[1] if best[0] > 0 else None
            if i is not None:
                self.pair(i, j, "sequence", self.all_tensors(self.ops_a[i], op_b))

    def by_feeding(self) -> None:
        """Unpaired ops of B that read only tensors paired with A's and whose output is an input of an op paired
        by sequence (the same tensor, or a view of it: the same statistics) take A's tensor there, or the
        output of A's unpaired op that made it."""
        fed: list[tuple[Node, TensorRecord, TensorRecord]] = [  # (A's op, A's input, B's input)
            (pair.op_a, ra, rb) for pair in self.pairs if pair.how == "sequence"
            for ra, rb in pair.tensors if rb.slot.startswith("inputs")]
        made_a = {r.payload: (i, r) for i, op in enumerate(self.ops_a) for r in op.outputs() if r.payload}
        for j, op_b in enumerate(self.ops_b):
            # only an op that reads tensors paired with A's: what it makes of them is its own doing
            if j in self.partner_b or not all(self.links.known(rb) for rb in op_b.inputs()):
                continue
            found = next(((op_a, ra, out, rb) for out in op_b.outputs() for op_a, ra, rb in fed
                          if rb.order > out.order and (compatible(ra, out) or compatible(ra, rb))
                          and self.same_tensor(out, rb)), None)
            if found is None:
                continue
            op_a, ra, out, rb = found
            if not compatible(ra, out):
                # read through a view that changes the shape (``k.transpose(2, 3)`` of a repeated ``k``): the
                # values compared are the op's output as the reading op saw it, in A's tensor's layout
                out = replace(rb, slot=out.slot, order=out.order)
            made = made_a.get(ra.payload) if ra.payload else None
            if made is not None and made[0] not in self.partner_a and compatible(made[1], out):
                self.pair(made[0], j, "feeding", [(made[1], out)])
            else:
                self.partner_b[j] = -1
                self.pairs.append(OpPair(op_a, op_b, "feeding", [(ra, out)]))

    def same_tensor(self, out: TensorRecord, rb: TensorRecord) -> bool:
        """``rb`` (of B) is ``out`` (of B), or a view of it that the capture did not record."""
        if out.payload is not None and out.payload == rb.payload:
            return True
        if numel(out) != numel(rb) or numel(out) is None:
            return False
        sa, sb = self.values.stats(out, "b"), self.values.stats(rb, "b")
        return bool(sa and sb and same_statistics(sa, sb))

    def by_last_output(self) -> None:
        order = sorted((j, i) for i, j in self.partner_a.items())
        limit = len(self.ops_a)
        for j in reversed(range(len(self.ops_b))):
            if j in self.partner_b:
                continue
            below = max((i for jj, i in order if jj < j), default=-1)
            above = min((i for jj, i in order if jj > j), default=len(self.ops_a))
            for rb in self.ops_b[j].outputs():
                found = next(((i, ra) for i in reversed(range(below + 1, min(above, limit)))
                              if i not in self.partner_a for ra in self.ops_a[i].outputs() if compatible(ra, rb)),
                             None)
                if found is not None:
                    self.pair(found[0], j, "value", [(found[1], rb)])
                    limit = found[0]
                    break


def _key(op: Node) -> tuple[object, ...]:
    return (op.op, tuple(t.shape for t in op.inputs()), tuple(t.shape for t in op.outputs()))


def _aligned(ops_a: Sequence[Node], ops_b: Sequence[Node]) -> list[tuple[int, int]]:
    """Index pairs of ops aligned as sequences by (name, shapes), then by short name where they differ."""
    out: list[tuple[int, int]] = []
    matcher = SequenceMatcher(None, [_key(o) for o in ops_a], [_key(o) for o in ops_b], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out.extend(zip(range(i1, i2), range(j1, j2)))
        elif i1 < i2 and j1 < j2:
            names = SequenceMatcher(None, [short_name(o) for o in ops_a[i1:i2]],
                                    [short_name(o) for o in ops_b[j1:j2]], autojunk=False)
            for block in names.get_matching_blocks():
                out.extend((i1 + block.a + k, j1 + block.b + k) for k in range(block.size))
    return out


def pair_ops_of_call(ops_a: list[Node], ops_b: list[Node], links: Links, values: Values,
                     agrees: Agrees) -> list[OpPair]:
    """The op pairs of one matched module call, in the order they were found (see the module docstring);
    ``links`` grows with the outputs of every pair."""
    call = _Call(ops_a, ops_b, links, values, agrees)
    call.by_dataflow()
    call.by_sequence()
    call.by_feeding()
    call.by_last_output()
    return call.pairs
