"""What ``align`` does for multi-rank traces (:mod:`tracediff.sharding`): place the tensors recorded without a
layout on the other trace's values, name the rank whose shard first goes out of tolerance, and collect what
the shards said on their own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..compare.metrics import compare_tensors
from ..compare.tolerance import default_tolerance
from ..errors import TracediffError
from ..sharding import ShardedTrace, ShardFinding
from ..trace.load import Trace
from ..trace.payload import Payload
from .pair import Pair
from .result import TensorComparison, fill


def place_unrecorded(trace_a: Trace, trace_b: Trace) -> None:
    """Place each side's tensors that have no layout against the other side's values (two sharded traces of one
    mesh: rank by rank first)."""
    if isinstance(trace_b, ShardedTrace) and isinstance(trace_a, ShardedTrace):
        trace_b.place_rankwise(trace_a)
    for mine, theirs in ((trace_b, trace_a), (trace_a, trace_b)):
        if isinstance(mine, ShardedTrace):
            mine.place_against(theirs, closeness=_close)


def _close(rebuilt: Payload, reference: Payload) -> bool:
    """Within the default tolerance of the pair's dtypes: the evidence that a placement is right."""
    if rebuilt.shape != reference.shape:
        return False
    atol, rtol = default_tolerance(f"torch.{rebuilt.dtype}", f"torch.{reference.dtype}")
    return bool(compare_tensors(rebuilt, reference, atol=atol, rtol=rtol).within_tolerance)


def name_ranks(rows: list[TensorComparison], pairs: Sequence[Pair], trace_a: Trace, trace_b: Trace,
               known: Mapping[int, int | None] | None = None) -> None:
    """Set ``rank`` on each row out of tolerance whose tensor is sharded in B (else in A): the rank, in mesh
    order, whose shard (or copy of a replica) first holds an element out of the row's tolerance. Rows change
    in place in ``rows``; a partial sum names no rank. ``known``: the ranks of rows measured where their
    shards live (``align(..., distributed=True)``), by row order: those pairs are not read again."""
    if not isinstance(trace_a, ShardedTrace) and not isinstance(trace_b, ShardedTrace):
        return
    for i, row in enumerate(rows):
        if row.within_tolerance is False and row.order < len(pairs):
            rank = known[row.order] if known is not None and row.order in known else \
                _first_rank(pairs[row.order], trace_a, trace_b, row)
            if rank is not None:
                rows[i] = fill(row, rank=rank)


def _first_rank(pair: Pair, trace_a: Trace, trace_b: Trace, row: TensorComparison) -> int | None:
    ra, rb = pair.record_a, pair.record_b
    side_b = isinstance(trace_b, ShardedTrace) and trace_b.shard_views(rb)
    views = side_b or (trace_a.shard_views(ra) if isinstance(trace_a, ShardedTrace) else [])
    if not views:
        return None
    try:
        a, b = trace_a.load_payload(ra), trace_b.load_payload(rb)
        if a.shape != b.shape:
            return None
        for rank, span, own in views:
            part_a, part_b = a.with_values(a.values[span]), b.with_values(b.values[span])
            if own is not None:  # a replica: this rank's own copy against the other side
                if side_b:
                    part_b = own()
                else:
                    part_a = own()
            if compare_tensors(part_a, part_b, atol=row.atol, rtol=row.rtol).within_tolerance is False:
                return rank
    except TracediffError:
        return None  # the row already says why it could not be read
    return None


def findings(trace_a: Trace, trace_b: Trace) -> tuple[ShardFinding, ...]:
    """The findings of both sides, A's first, each marked with its side."""
    found: list[ShardFinding] = []
    for side, trace in (("A", trace_a), ("B", trace_b)):
        if isinstance(trace, ShardedTrace):
            found.extend(replace(finding, side=side) for finding in trace.findings)
    return tuple(found)
