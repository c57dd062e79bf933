"""``align(..., distributed=True)``: each rank of a torchrun launch compares the shards stored in its own rank
folder, and rank 0 merges what they measured into the rows the one-process ``align`` builds.

Every rank reads the JSON of both traces (small) and pairs them the same way; only payloads are node-local.
For each pair whose B tensor is sharded (a slice along one dim, or a replica) rank ``r`` reads its own shard
and the slice of A's tensor that shard covers, and measures them into a :class:`tracediff.compare.parts.PartMetrics`
(replicas: also a digest of its copy's bytes). ``torch.distributed.gather_object`` sends those small states to
rank 0, which merges them per tensor (:func:`tracediff.compare.parts.merge_parts`), names the first rank out
of tolerance and the ranks whose copy of a replica differs, runs the verdict stages and broadcasts the
finished ``Alignment`` so that every rank returns it. No payload travels between ranks.

Measured on rank 0 from the rebuilt tensor instead (these read the other ranks' files, so they need storage
rank 0 can read): partial sums and meshes of more than one dimension, integer and bool tensors, pairs compared
through a layout transform, and pairs whose A side is itself sharded. What a merged row leaves out is listed
in docs/distributed.md ("Compare where the data lives").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Container, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compare.benign import saturated_note, settle_saturated
from ..compare.measurement import Measurement, dtype_note, measured, unmeasured
from ..compare.parts import measure_part, merge_parts
from ..compare.positions import beyond_per_position, position_error_ratios
from ..errors import PayloadFormatError, TracediffError, UsageError
from ..sharding import ShardedTrace
from ..trace.load import Trace
from ..trace.payload import as_floats, is_floating
from .lm_results import PositionStrip
from .lm_verdicts import TokenSpans
from .pair import Pair
from .result import TensorComparison

_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Group:
    """This process's place in the launch: its rank and the world size."""

    rank: int
    world: int

    @property
    def is_root(self) -> bool:
        return self.rank == 0


@contextmanager
def distributed_run() -> Iterator[Group]:
    """The process group of a torchrun launch (gloo), joined for the time of one alignment.

    A group the caller already started is used as it is and left open; one started here is destroyed on
    exit. Without torchrun's environment (``RANK``, ``WORLD_SIZE``, ...) it is a ``UsageError``.
    """
    missing = [name for name in _ENV if name not in os.environ]
    if missing:
        raise UsageError(f"--distributed: {', '.join(missing)} not set: launch with torchrun --nproc-per-node N -m "
                         "tracediff align REF SHARDED --distributed")
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo")
    try:
        yield Group(dist.get_rank(), dist.get_world_size())
    finally:
        if created:
            dist.destroy_process_group()


def wait_for_all() -> None:
    """A barrier of the launch's group: every rank waits here until all have come."""
    import torch.distributed as dist

    dist.barrier()


def shared(group: Group, build: Callable[[], Any]) -> Any:
    """``build()`` on every rank, rank 0's outcome broadcast to all: its result returned, its error raised."""
    import torch.distributed as dist

    outcome: list[Any] = [None]
    failure: Exception | None = None
    if group.is_root:
        try:
            outcome[0] = ("result", build())
        except TracediffError as e:
            outcome[0] = ("error", e)
        except Exception as e:  # an internal error: the other ranks must not wait for a result forever
            outcome[0], failure = ("internal", f"{type(e).__name__}: {e}"), e
    else:
        build()  # measures its shards, then returns before the verdict stages
    dist.broadcast_object_list(outcome, src=0)
    kind, value = outcome[0]
    if failure is not None:
        raise failure
    if kind == "error":
        raise value
    if kind == "internal":
        raise RuntimeError(f"rank 0 failed: {value}")
    return value


@dataclass(frozen=True)
class Merged:
    """What rank 0 merged, by row order: each row's measurement; for a tensor sliced over ranks (never read whole),
    its Pearson correlation and the positions along its sequence dimension that hold an element out of
    tolerance (None: none); the first rank out of tolerance; and the position strip of the first sliced row out
    of tolerance."""

    measurements: dict[int, Measurement]
    apart: dict[int, tuple[float, np.ndarray | None]]
    ranks: dict[int, int | None]
    strips: dict[int, np.ndarray]  # the first sliced row out of tolerance: each position's largest error ratio


# (order, the part or the reason it could not be read, a replica copy's digest, where this rank's slice starts
# along the sequence dimension and which of its positions hold an element out of tolerance, how many saturated
# or masked positions were taken as equal)
_Local = tuple[int, Any, str | None, tuple[int, np.ndarray] | None, int]


def measure_where_stored(group: Group, pairs: Sequence[Pair], trace_a: Trace, trace_b: Trace,
                         tolerance: Callable[[int], tuple[float, float]], whole: Container[int], spans: TokenSpans
                         ) -> Merged | None:
    """Each rank measures its shard of every pair it can; rank 0 gets the merged rows (other ranks: None).

    Collective: every rank of ``group`` must call it with the same pairs. ``tolerance(order)`` is the pair's
    (atol, rtol); ``whole``: the orders of the pairs left to rank 0 (those compared through a layout transform);
    ``spans``: ``TokenSpans.of(trace_b)``."""
    import torch.distributed as dist

    sharded = trace_b if isinstance(trace_b, ShardedTrace) else None
    if sharded is None or sharded.world_size != group.world:  # every rank finds it: none waits in a collective
        held = f"holds {sharded.world_size} rank folders" if sharded is not None else "is not a multi-rank folder"
        raise UsageError(f"{trace_b.directory}: --distributed runs one process per rank folder of B, and B {held} "
                         f"for {group.world} processes: launch torchrun --nproc-per-node with B's rank count")
    orders = [i for i, pair in enumerate(pairs) if i not in whole and _splittable(pair, trace_a, sharded, group.world)]
    local: list[_Local] = []
    failure: str | None = None
    axes = _axes(pairs, orders, spans)
    for order in orders:
        try:
            local.append(_measure_mine(group.rank, pairs[order], trace_a, sharded, *tolerance(order), axes.get(order)))
        except PayloadFormatError as e:  # a broken trace is refused whole, on rank 0, after the gather
            failure = str(e)
            break
        except TracediffError as e:
            local.append((order, str(e), None, None, 0))
    everyone: list[Any] = [None] * group.world if group.is_root else []
    dist.gather_object((local, failure), everyone if group.is_root else None, dst=0)
    merged, failed, candidate = None, None, None
    if group.is_root:
        failed = next((f for _, f in everyone if f is not None), None)
        if failed is None:
            by_rank = [{order: (part, digest, beyond, saturated) for order, part, digest, beyond, saturated in mine}
                       for mine, _ in everyone]
            merged = Merged({}, {}, {}, {})
            for order in orders:
                _merge(order, pairs[order], by_rank, sharded, tolerance(order), merged)
            candidate = next((order for order in orders if order in merged.apart and order in axes
                              and merged.measurements[order].within_tolerance is False), None)
    # the first sliced row out of tolerance, if it has a sequence dim: every rank sends its position ratios, for
    # the position strip of the first divergence (one tensor's slice read again per rank)
    box = [candidate]
    dist.broadcast_object_list(box, src=0)
    candidate = box[0]
    if candidate is not None:
        ratios = _ratios_mine(group.rank, pairs[candidate], trace_a, sharded, *tolerance(candidate), axes[candidate])
        every_ratio: list[Any] = [None] * group.world if group.is_root else []
        dist.gather_object(ratios, every_ratio if group.is_root else None, dst=0)
        if merged is not None and all(r is not None for r in every_ratio):
            merged.strips[candidate] = _joined(every_ratio, float, np.maximum)
    if failed is not None:
        raise PayloadFormatError(failed)
    return merged


def strip_of(merged: Merged, first: TensorComparison, pair: Pair, spans: TokenSpans) -> PositionStrip | None:
    """The position strip of ``first``, a row sliced over ranks, from the ratios its ranks sent (None: none)."""
    ratios = merged.strips.get(first.order)
    axis = spans.of_pair(pair)
    if ratios is None or axis is None:
        return None
    return PositionStrip(first.order, axis[1], tuple(float(r) for r in ratios))


def _ratios_mine(rank: int, pair: Pair, trace_a: Trace, trace_b: ShardedTrace, atol: float, rtol: float,
                 axis: int) -> tuple[int, np.ndarray] | None:
    """Where this rank's slice starts along ``axis``, and the largest error ratio at each of its positions."""
    ra, rb = pair.record_a, pair.record_b
    try:
        span = next(span for r, span, _ in trace_b.shard_views(rb) if r == rank)
        whole, raw = trace_a.load_payload(ra), trace_b.local_shard(rb, rank)
    except TracediffError:
        return None
    a = as_floats(whole.values[span], whole.dtype, np.float64)
    b = as_floats(raw.values, raw.dtype, np.float64)
    if a.shape != b.shape:
        return None
    return span[axis].start or 0, position_error_ratios(a, b, atol=atol, rtol=rtol, dim=axis)


def _joined(sent: list[tuple[int, np.ndarray]], dtype: type, combine: np.ufunc) -> np.ndarray:
    """The ranks' per-position arrays (position error ratios, masks out of tolerance), each placed at its
    slice's start and combined where slices overlap (``np.maximum``, ``np.logical_or``)."""
    joined: np.ndarray = np.zeros(max(start + values.size for start, values in sent), dtype)
    for start, values in sent:
        view = joined[start:start + values.size]
        combine(view, values, out=view)
    return joined


def _splittable(pair: Pair, trace_a: Trace, trace_b: ShardedTrace, world: int) -> bool:
    """A pair whose B is sliced over ranks along one dim (or replicated) and A read whole: measured in parts."""
    ra, rb = pair.record_a, pair.record_b
    if isinstance(trace_a, ShardedTrace):
        return False
    if not (ra.has_payload and rb.has_payload) or ra.shape is None or ra.shape != rb.shape:
        return False
    if not (ra.dtype and rb.dtype and is_floating(ra.dtype.removeprefix("torch."))
            and is_floating(rb.dtype.removeprefix("torch."))):
        return False
    return len(trace_b.shard_views(rb)) == world


def _axes(pairs: Sequence[Pair], orders: list[int], spans: TokenSpans) -> dict[int, int]:
    """The sequence dimension of each pair that has one (positions are named along it)."""
    found = {order: spans.of_pair(pairs[order]) for order in orders}
    return {order: axis[0] for order, axis in found.items() if axis is not None}


def _measure_mine(rank: int, pair: Pair, trace_a: Trace, trace_b: ShardedTrace, atol: float, rtol: float,
                  axis: int | None) -> _Local:
    """This rank's shard of ``pair`` against the slice of A it covers."""
    ra, rb = pair.record_a, pair.record_b
    span = next(span for r, span, _ in trace_b.shard_views(rb) if r == rank)
    whole = trace_a.load_payload(ra)
    a = whole.with_values(whole.values[span])
    raw = trace_b.local_shard(rb, rank)
    if a.shape != raw.shape:
        return rb.order, f"rank {rank}'s shard has shape {list(raw.shape)}, its slice of A {list(a.shape)}", None, \
            None, 0
    b, counts = settle_saturated(a, raw)
    saturated = sum(counts)  # saturated and masked positions, both treated as equal
    part = measure_part(a, b, atol=atol, rtol=rtol)
    replica = trace_b.placed[rb.order].layout
    digest = _digest(b.values, b.dtype) if replica is not None and replica.replicated else None
    beyond = None
    if axis is not None and (part.mismatched or saturated):  # positions are read from the payloads as stored
        beyond = (span[axis].start or 0, beyond_per_position(as_floats(a.values, a.dtype, np.float64),
                                                            as_floats(raw.values, raw.dtype, np.float64),
                                                            atol=atol, rtol=rtol, dim=axis))
    return rb.order, part, digest, beyond, saturated


def _digest(values: np.ndarray, dtype: str) -> str:
    """The bytes of a replica's copy, hashed: two ranks' copies compared without sending either."""
    import hashlib  # here: only a distributed alignment hashes, and its import costs a one-rank start-up 3 ms

    h = hashlib.blake2b(f"{dtype}{values.shape}".encode(), digest_size=16)
    h.update(np.ascontiguousarray(values).view(np.uint8).reshape(-1).data)
    return h.hexdigest()


def _positions(slices: list[tuple[int, np.ndarray] | None]) -> np.ndarray | None:
    """The ranks' masks of positions out of tolerance, joined (None: none sent)."""
    sent = [s for s in slices if s is not None]
    return _joined(sent, bool, np.logical_or) if sent else None


def _merge(order: int, pair: Pair, by_rank: list[dict[int, tuple[Any, str | None, Any, int]]],
           trace_b: ShardedTrace, tol: tuple[float, float], merged: Merged) -> None:
    ra, rb = pair.record_a, pair.record_b
    ranks = [r for r, _, _ in trace_b.shard_views(rb)]  # mesh order
    sent = [by_rank[r].get(rb.order) for r in ranks]
    found = [f for f in sent if f is not None]
    if len(found) < len(sent):
        merged.measurements[order] = unmeasured("unreadable", None, "a rank measured nothing for this tensor")
        return
    errors = [(r, f[0]) for r, f in zip(ranks, found) if isinstance(f[0], str)]
    if errors:
        rank, reason = errors[0]
        merged.measurements[order] = unmeasured("unreadable", None, f"rank {rank}: {reason}")
        return
    parts = [f[0] for f in found]
    slices = [f[2] for f in found]
    counts = [f[3] for f in found]
    layout = trace_b.placed[rb.order].layout
    replicated = layout is not None and layout.replicated
    if replicated:  # the row is the first copy's, as one process reads it; the others are checked alike
        first = found[0][1]
        for rank, f in zip(ranks[1:], found[1:]):
            if f[1] != first:
                trace_b.note_replica_difference(rb, rank, ranks[0], "its bytes differ, compared where each lives")
    row_parts = parts[:1] if replicated else parts
    saturated = counts[0] if replicated else sum(counts)
    metrics, pcc = merge_parts(row_parts, atol=tol[0], rtol=tol[1])
    note = "; ".join(filter(None, [dtype_note(ra, rb), saturated_note(saturated) if saturated else ""]))
    merged.measurements[order] = measured(metrics, approximate=False, note=note)
    if replicated:  # rank 0's own copy is the whole tensor: the later stages read it, and A, as one process does
        trace_b.mark_replica_checked(rb)
    else:
        merged.apart[order] = (pcc, _positions(slices))
    merged.ranks[order] = next((r for r, p in zip(ranks, parts) if p.mismatched), None)
