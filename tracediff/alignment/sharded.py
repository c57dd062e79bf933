"""What ``align`` does for multi-rank traces (:mod:`tracediff.sharding`): place the tensors recorded without a
layout on the other trace's values, name the rank whose shard first goes out of tolerance, and collect what
the shards said on their own."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..compare.metrics import compare_tensors
from ..compare.tolerance import default_tolerance
from ..sharding import ShardedTrace, ShardFinding
from ..trace.load import Trace
from ..trace.payload import Payload
from .result import Job, TensorComparison, fill


def place_unrecorded(trace_a: Trace, trace_b: Trace) -> None:
    """Place each side's tensors that have no layout against the other side's values."""
    for mine, theirs in ((trace_b, trace_a), (trace_a, trace_b)):
        if isinstance(mine, ShardedTrace):
            mine.place_against(theirs, closeness=_close)


def _close(rebuilt: Payload, reference: Payload) -> bool:
    """Within the default tolerance of the pair's dtypes: the evidence that a placement is right."""
    if rebuilt.shape != reference.shape:
        return False
    atol, rtol = default_tolerance(f"torch.{rebuilt.dtype}", f"torch.{reference.dtype}")
    return bool(compare_tensors(rebuilt, reference, atol=atol, rtol=rtol).within_tolerance)


def name_ranks(rows: list[TensorComparison], jobs: list[Job], trace_a: Trace, trace_b: Trace) -> None:
    """Set ``rank`` on each row out of tolerance whose tensor is sharded in B (else in A): the rank, in mesh
    order, whose shard first holds an element out of the row's tolerance. Rows change in place in ``rows``."""
    sides = [(t, i) for t, i in ((trace_b, 3), (trace_a, 1)) if isinstance(t, ShardedTrace)]
    if not sides:
        return
    for i, row in enumerate(rows):
        if row.within_tolerance is not False or row.order >= len(jobs):
            continue
        job = jobs[row.order]
        for trace, at in sides:
            rank = _first_rank(trace, job, at, trace_a, trace_b, row)
            if rank is not None:
                rows[i] = fill(row, rank=rank)
                break


def _first_rank(trace: Any, job: Job, at: int, trace_a: Trace, trace_b: Trace, row: TensorComparison) -> int | None:
    ra, rb = job[1], job[3]
    try:
        a, b = trace_a.load_payload(ra), trace_b.load_payload(rb)
    except Exception:  # noqa: BLE001 - the row already says why it could not be read
        return None
    if a.shape != b.shape:
        return None

    def exceeds(span: tuple[slice, ...]) -> bool:
        part_a, part_b = a.with_values(a.values[span]), b.with_values(b.values[span])
        return compare_tensors(part_a, part_b, atol=row.atol, rtol=row.rtol).within_tolerance is False

    return trace.rank_of_first_error(job[at], exceeds)


def findings(trace_a: Trace, trace_b: Trace) -> tuple[ShardFinding, ...]:
    """The findings of both sides, A's first, each marked with its side."""
    found: list[ShardFinding] = []
    for side, trace in (("A", trace_a), ("B", trace_b)):
        if isinstance(trace, ShardedTrace):
            found.extend(replace(finding, side=side) for finding in trace.findings)
    return tuple(found)
