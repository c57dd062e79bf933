"""Aligning op nodes (op-level capture) inside each matched pair of module calls.

Ops are only ever paired within one matched module-call pair (same enclosing
module, same call), by dataflow and values, so that the same math computed in
another order is compared where the results meet, not op by op (see
:mod:`tracediff.alignment.pairing.dataflow`): an op pairs with an op of the
same name whose inputs are the same tensors (the module's inputs, its
submodules' outputs, the outputs of ops paired before) or hold the same
values; an op whose output agrees in value with one of the other side pairs
with it by value; intermediates without a partner are unmatched, never errors.
Paired ops compare their tensors (``inputs.args.0``, ``outputs``...) and, when
their qualified names are equal, their non-tensor arguments (a different
``scale=`` of ``scaled_dot_product_attention`` is an argument difference).

Rows of ops carry ``op`` and ``op_index`` (B's: the ``op_index`` recorded in
B's trace, the number ``tracediff show`` prints), the enclosing module's paths
and call indices, and ``tensor_a`` names A's op and its own ``op_index``
(``"torch.matmul #5 outputs"``). ``matched_by`` says how the ops paired:
``dataflow`` (same inputs), ``value`` (the outputs agree, or the last output
of a stretch A computes with other ops), ``name`` (aligned as sequences after
a divergence). Ops of a module call that the other trace did not record with
ops (a trace captured without ops, or with another ``ops_in``) are unmatched:
``Unmatched.tensor`` is ``"op #5 torch.matmul"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from ..compare.records import compare_records
from ..compare.tolerance import TolerancePolicy
from ..trace.load import Trace
from ..trace.model import Node, TensorRecord
from .pair import Evidence, MatchedBy, Pair
from .pairing.dataflow import VALUE_COMPARISONS, Links, OpPair, pair_ops_of_call
from .pairing.evidence import Values
from .pairing.make import pair_of
from .result import ArgumentDiff, Unmatched
from .rows import RowDraft
from .verdicts.arguments import diff_arguments

__all__ = ["VALUE_COMPARISONS", "OpPairing", "annotate_op_rows", "op_label", "pair_ops"]

#: ``matched_by`` of an op row, by how its ops paired (alignment.pairing.dataflow)
_MATCHED_BY = {"dataflow": MatchedBy.DATAFLOW, "value": MatchedBy.VALUE, "sequence": MatchedBy.NAME,
               "feeding": MatchedBy.DATAFLOW}


@dataclass
class OpPairing:
    """What op alignment adds to an alignment: tensor pairs to compare, and what did not pair."""

    pairs: list[Pair] = field(default_factory=list)
    unmatched_a: list[Unmatched] = field(default_factory=list)
    unmatched_b: list[Unmatched] = field(default_factory=list)
    argument_diffs: list[ArgumentDiff] = field(default_factory=list)


def op_label(op: Node, slot: str | None = None) -> str:
    """``op #5 torch.matmul`` (with `` outputs`` when a slot is given): how unmatched ops are listed."""
    return f"op #{op.op_index} {op.op}" + (f" {slot}" if slot else "")


def pair_ops(trace_a: Trace, trace_b: Trace, pairs: Iterable[tuple[Node, Node]], policy: TolerancePolicy,
             *, values: Values | None = None, tensor_pairs: Iterable[Pair] = ()) -> OpPairing:
    """Pair the op nodes of every matched module-call pair (see the module docstring).

    ``tensor_pairs`` are the module tensors already paired: what flows from them into ops is the same
    tensor on both sides. ``values`` reads the statistics of both traces (one is made when None).
    """
    out = OpPairing()
    values = values if values is not None else Values(trace_a, trace_b)
    links = Links()
    for pair in tensor_pairs:
        links.add(pair.record_a, pair.record_b)

    for node_a, node_b in pairs:
        if node_a.ops or node_b.ops:
            paths = (node_a.relative_path, node_b.relative_path)

            def agrees(ra: TensorRecord, rb: TensorRecord, paths: tuple[str, str] = paths) -> bool:
                atol, rtol = policy.resolve(paths, ra.dtype, rb.dtype)
                return compare_records(trace_a, ra, trace_b, rb, atol=atol, rtol=rtol).within_tolerance is True

            _pair_call(node_a, node_b, pair_ops_of_call(node_a.ops, node_b.ops, links, values, agrees), out)
    return out


def _pair_call(node_a: Node, node_b: Node, found: list[OpPair], out: OpPairing) -> None:
    used_a: set[int] = set()
    used_b: set[int] = set()
    for pair in found:
        op_a, op_b = pair.op_a, pair.op_b
        used_b.add(id(op_b))
        if pair.how != "feeding":
            used_a.add(id(op_a))
        by = _MATCHED_BY[pair.how]
        evidence = Evidence.VALUE if by is MatchedBy.VALUE else Evidence.NAME
        out.pairs += [pair_of(op_a, ra, op_b, rb, by=by, evidence=evidence) for ra, rb in pair.tensors]
        if pair.how in ("dataflow", "sequence"):
            compared_a = {id(ra) for ra, _ in pair.tensors}
            compared_b = {id(rb) for _, rb in pair.tensors}
            out.unmatched_a += [Unmatched(op_a.module_path, op_a.call_index, op_label(op_a, t.slot))
                                for t in op_a.tensors if id(t) not in compared_a]
            out.unmatched_b += [Unmatched(op_b.module_path, op_b.call_index, op_label(op_b, t.slot))
                                for t in op_b.tensors if id(t) not in compared_b]
            if op_a.op == op_b.op and op_a.values != op_b.values:  # aliases (F.softmax, torch.softmax) differ
                out.argument_diffs += [replace(d, slot=op_label(op_b, d.slot))
                                       for d in diff_arguments([(op_a, op_b)])]
    out.unmatched_a += [Unmatched(op.module_path, op.call_index, op_label(op)) for op in node_a.ops
                        if id(op) not in used_a]
    out.unmatched_b += [Unmatched(op.module_path, op.call_index, op_label(op)) for op in node_b.ops
                        if id(op) not in used_b]


def annotate_op_rows(rows: Sequence[RowDraft], pairs: Sequence[Pair]) -> None:
    """Set ``op``/``op_index`` (B's) and ``tensor_a`` (A's op, its index and slot) of the drafts of op pairs.
    ``rows[i]`` must be the draft of ``pairs[i]``."""
    for row, pair in zip(rows, pairs):
        op_a, op_b = pair.node_a, pair.node_b
        if op_b.op is None:
            continue
        if op_a.op is not None:
            row.tensor_a = f"{op_a.op} #{op_a.op_index} {pair.record_a.slot}"
        row.op = op_b.op
        row.op_index = op_b.op_index
