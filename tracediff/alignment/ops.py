"""Aligning op nodes (op-level capture) inside each matched pair of module calls.

Ops are only ever paired within one matched module-call pair (same enclosing
module, same call), in two passes:

1. **By sequence**: the op lists of A and B are aligned as sequences of
   ``(qualified name, input shapes, output shapes)`` (``difflib``'s longest
   matching blocks), then, inside the stretches that differ, of short names
   alone (``softmax`` pairs ``torch.softmax`` with ``torch.nn.functional.softmax``).
   Paired ops compare their tensors slot by slot (``inputs.args.0``,
   ``outputs``...) and, when their names are equal, their non-tensor arguments (a different ``scale=`` of
   ``scaled_dot_product_attention`` is an argument difference).
2. **By value**, for the ops left over when the two implementations use
   different op sequences for the same math (``matmul`` + ``softmax`` +
   ``matmul`` against ``scaled_dot_product_attention``; ``repeat_interleave``
   against ``expand`` + ``reshape``): each output of a left-over op of A, in
   call order, is paired with the first unused output of a left-over op of
   B, in the same call, whose shape agrees (singleton dimensions aside) and
   whose values are within tolerance. When none agrees, it is paired with
   the closest candidate of that shape, so that the first output of A that B
   no longer reproduces becomes a diverged row. Outputs with no candidate of
   their shape (``matmul``'s attention scores, which ``sdpa`` never
   materializes) are listed as unmatched, never as errors. At most
   ``VALUE_COMPARISONS`` payload pairs are compared per stretch.

Rows of ops carry ``op`` and ``op_index`` (B's), the enclosing module's paths
and call indices, ``matched_by="value"`` when paired by value, and then
``tensor_a`` names A's op (``"torch.matmul #5 outputs"``). Ops of a module
call that the other trace did not record with ops (a trace captured without
ops, or with another ``ops_in``) are unmatched: ``Unmatched.tensor`` is
``"op #5 torch.matmul"``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher
from itertools import pairwise

from ..compare.records import compare_records
from ..compare.shapes import squeezable
from ..compare.tolerance import TolerancePolicy
from ..trace.load import Trace
from ..trace.model import Node, TensorRecord
from .pairing.calls import pair_tensors
from .result import ArgumentDiff, Job, Unmatched
from .rows import RowDraft
from .verdicts.arguments import diff_arguments

#: At most this many payload comparisons when pairing one stretch by value (two unrelated op sequences
#: of a few hundred same-shaped ops would otherwise compare every pair); past it, only the last-output rule pairs.
VALUE_COMPARISONS = 1024


@dataclass
class OpPairing:
    """What op alignment adds to an alignment: tensor pairs to compare, and what did not pair."""

    jobs: list[Job] = field(default_factory=list)
    unmatched_a: list[Unmatched] = field(default_factory=list)
    unmatched_b: list[Unmatched] = field(default_factory=list)
    argument_diffs: list[ArgumentDiff] = field(default_factory=list)
    by_value: set[tuple[int, int]] = field(default_factory=set)


def op_label(op: Node, slot: str | None = None) -> str:
    """``op #5 torch.matmul`` (with `` outputs`` when a slot is given): how unmatched ops are listed."""
    return f"op #{op.op_index} {op.op}" + (f" {slot}" if slot else "")


def pair_ops(trace_a: Trace, trace_b: Trace, pairs: Iterable[tuple[Node, Node]],
             policy: TolerancePolicy) -> OpPairing:
    """Pair the op nodes of every matched module-call pair (see the module docstring)."""
    out = OpPairing()
    for node_a, node_b in pairs:
        if node_a.ops or node_b.ops:
            _pair_call(trace_a, trace_b, node_a, node_b, policy, out)
    return out


def _shapes(op: Node, side: str) -> tuple[tuple[int, ...] | None, ...]:
    return tuple(t.shape for t in op.tensors if t.slot.startswith(side))


def _key(op: Node) -> tuple[object, ...]:
    return (op.op, _shapes(op, "inputs"), _shapes(op, "outputs"))


def _short(op: Node) -> str:
    """``softmax`` for ``torch.softmax``, ``torch.nn.functional.softmax`` and ``torch.Tensor.softmax`` alike."""
    return (op.op or "").rsplit(".", 1)[-1].strip("_")


def _aligned(ops_a: list[Node], ops_b: list[Node]) -> list[tuple[int, int]]:
    """Index pairs of ops aligned by (name, shapes), then by name inside the stretches that differ."""
    out: list[tuple[int, int]] = []
    matcher = SequenceMatcher(None, [_key(o) for o in ops_a], [_key(o) for o in ops_b], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out.extend(zip(range(i1, i2), range(j1, j2)))
        elif i1 < i2 and j1 < j2:
            names = SequenceMatcher(None, [_short(o) for o in ops_a[i1:i2]], [_short(o) for o in ops_b[j1:j2]],
                                    autojunk=False)
            for block in names.get_matching_blocks():
                out.extend((i1 + block.a + k, j1 + block.b + k) for k in range(block.size))
    return out


def _pair_call(trace_a: Trace, trace_b: Trace, node_a: Node, node_b: Node, policy: TolerancePolicy,
               out: OpPairing) -> None:
    aligned = _aligned(node_a.ops, node_b.ops)
    named_pairs = [(node_a.ops[i], node_b.ops[j]) for i, j in aligned]
    for op_a, op_b in named_pairs:
        tensor_pairs, only_a, only_b = pair_tensors(op_a, op_b)
        out.jobs.extend((op_a, ra, op_b, rb) for ra, rb in tensor_pairs)
        out.unmatched_a += [Unmatched(op_a.module_path, op_a.call_index, op_label(op_a, t.slot)) for t in only_a]
        out.unmatched_b += [Unmatched(op_b.module_path, op_b.call_index, op_label(op_b, t.slot)) for t in only_b]
        if op_a.op == op_b.op and op_a.values != op_b.values:  # aliases (F.softmax, torch.softmax) differ in keywords
            out.argument_diffs += [replace(d, slot=op_label(op_b, d.slot)) for d in diff_arguments([(op_a, op_b)])]
    # The stretches between ops paired by sequence: what one side computes there with other ops.
    bounds = [(-1, -1), *aligned, (len(node_a.ops), len(node_b.ops))]
    for (i0, j0), (i1, j1) in pairwise(bounds):
        left_a, left_b = node_a.ops[i0 + 1:i1], node_b.ops[j0 + 1:j1]
        used_a, used_b = _pair_by_value(trace_a, trace_b, left_a, left_b, policy, out) if left_a and left_b \
            else (set(), set())
        out.unmatched_a += [Unmatched(op.module_path, op.call_index, op_label(op))
                            for op in left_a if id(op) not in used_a]
        out.unmatched_b += [Unmatched(op.module_path, op.call_index, op_label(op))
                            for op in left_b if id(op) not in used_b]


def _pair_by_value(trace_a: Trace, trace_b: Trace, left_a: list[Node], left_b: list[Node],
                   policy: TolerancePolicy, out: OpPairing) -> tuple[set[int], set[int]]:
    """Pair op outputs of one stretch of A with those of B that reproduce them; then the last ones left.

    First every output of A, in call order, takes the first unused output of
    B of a compatible shape within tolerance. Then, going backwards, each
    output of B left takes the latest output of A left of a compatible shape
    (earlier than the one taken before): the result of a replaced sequence is
    its last op's output, so a fused op that computes something else shows
    as one diverged row instead of vanishing.
    """
    outputs_a = [(op, r) for op in left_a for r in op.outputs()]
    outputs_b = [(op, r) for op in left_b for r in op.outputs()]
    paired: list[tuple[int, int]] = []
    taken_b: set[int] = set()
    budget = VALUE_COMPARISONS
    for ia, (op_a, ra) in enumerate(outputs_a):
        for ib, (op_b, rb) in enumerate(outputs_b):
            if ib in taken_b or not _shape_compatible(ra, rb) or budget <= 0:
                continue
            budget -= 1
            if _agrees(trace_a, ra, op_a, trace_b, rb, op_b, policy):
                paired.append((ia, ib))
                taken_b.add(ib)
                break
    taken_a = {ia for ia, _ in paired}
    limit = len(outputs_a)
    for ib in reversed(range(len(outputs_b))):
        if ib in taken_b:
            continue
        ra_index = next((ia for ia in reversed(range(limit)) if ia not in taken_a
                         and _shape_compatible(outputs_a[ia][1], outputs_b[ib][1])), None)
        if ra_index is not None:
            paired.append((ra_index, ib))
            taken_a.add(ra_index)
            limit = ra_index
    for ia, ib in paired:
        (op_a, ra), (op_b, rb) = outputs_a[ia], outputs_b[ib]
        out.jobs.append((op_a, ra, op_b, rb))
        out.by_value.add((id(ra), id(rb)))
    return {id(outputs_a[ia][0]) for ia, _ in paired}, {id(outputs_b[ib][0]) for _, ib in paired}


def _agrees(trace_a: Trace, ra: TensorRecord, op_a: Node, trace_b: Trace, rb: TensorRecord, op_b: Node,
            policy: TolerancePolicy) -> bool:
    atol, rtol = policy.resolve((op_a.relative_path, op_b.relative_path), ra.dtype, rb.dtype)
    return compare_records(trace_a, ra, trace_b, rb, atol=atol, rtol=rtol).within_tolerance is True


def _shape_compatible(ra: TensorRecord, rb: TensorRecord) -> bool:
    if ra.shape is None or rb.shape is None:
        return False
    return ra.shape == rb.shape or squeezable(ra.shape, rb.shape)


def annotate_op_rows(rows: list[RowDraft], jobs: list[Job], pairing: OpPairing) -> None:
    """Set ``op``/``op_index`` (and ``matched_by``, ``tensor_a`` for pairs by value) of the drafts of op pairs.

    ``rows[i]`` must be the draft of ``jobs[i]``.
    """
    for row, (op_a, ra, op_b, rb) in zip(rows, jobs):
        if op_b.op is None:
            continue
        if (id(ra), id(rb)) in pairing.by_value:
            row.matched_by = "value"
            row.pairing = "value"
            row.tensor_a = f"{op_a.op} #{op_a.op_index} {ra.slot}"
        row.op = op_b.op
        row.op_index = op_b.op_index
