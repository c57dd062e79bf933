"""A tensor's layout over the device mesh, and the global tensor rebuilt from its shards.

A layout is one placement per mesh dimension: ``R`` (every rank of that
dimension holds the same tensor), ``S(d)`` (each holds a slice along tensor
dim ``d``, in coordinate order) or ``P`` (each holds a partial sum). The global
tensor is rebuilt innermost mesh dimension first, as torch's DTensor nests its
shards: concatenate the slices, sum the partials, check the replicas alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import format as fmt
from ..errors import PayloadError
from ..trace.payload import Payload, as_floats, is_floating

#: (kind, dim): ("R", None), ("P", None), ("S", d)
Placement = tuple[str, int | None]
#: The longest placement code read: ``S(-d)`` with a dim of 18 digits (a shape's dims have at most 18).
_LONGEST_CODE = len("S(-)") + 18
#: ``Layout.source`` of a tensor that neither of two sharded traces of one mesh places: each rank's shard is
#: compared with the same rank's shard of the other trace, the global tensor being the shards stacked in rank
#: order along a new leading dim.
RANKWISE = "rankwise"


@dataclass(frozen=True)
class Layout:
    """The placements of one tensor (one per mesh dimension) and where they came from (``dtensor``, ``style``,
    ``declared``, ``value``: placed by the reference's values, ``replica``: no layout, equal on every rank)."""

    placements: tuple[Placement, ...]
    source: str
    global_shape: tuple[int, ...] | None = None

    @property
    def replicated(self) -> bool:
        return all(kind == fmt.REPLICATE for kind, _ in self.placements)

    @property
    def partial(self) -> bool:
        return any(kind == fmt.PARTIAL for kind, _ in self.placements)

    def describe(self) -> str:
        """``"S(-1) (style)"``: the placements as written in a trace, and their source."""
        if self.source == RANKWISE:
            return "rank by rank (rankwise)"
        codes = [fmt.shard_code(dim) if kind == "S" and dim is not None else kind for kind, dim in self.placements]
        return f"{', '.join(codes)} ({self.source})"


def parse_layout(entry: Any, mesh_dims: int) -> Layout | None:
    """The ``Layout`` of a ``layout`` object, or None when it is not one (its placements unknown, another count
    of mesh dimensions than the mesh has)."""
    if not isinstance(entry, dict):
        return None
    codes = entry.get(fmt.LAYOUT_PLACEMENTS)
    if not isinstance(codes, list) or len(codes) != mesh_dims:
        return None
    if not all(isinstance(code, str) and len(code) <= _LONGEST_CODE for code in codes):
        return None  # never int() of thousands of digits (Python refuses over 4,300): S(d) has at most 18
    placements = [fmt.parse_placement(code) for code in codes]
    if any(p is None for p in placements):
        return None
    shape = entry.get(fmt.LAYOUT_GLOBAL_SHAPE)
    global_shape = tuple(shape) if isinstance(shape, list) and all(type(n) is int for n in shape) else None
    source = entry.get(fmt.LAYOUT_SOURCE)
    return Layout(tuple(p for p in placements if p is not None), source if isinstance(source, str) else "dtensor",
                  global_shape)


def _groups(coordinates: Sequence[tuple[int, ...]], ranks: Sequence[int], depth: int) -> list[list[int]]:
    """``ranks`` grouped by their coordinate on mesh dimension ``depth``, in coordinate order."""
    by: dict[int, list[int]] = {}
    for rank in ranks:
        by.setdefault(coordinates[rank][depth], []).append(rank)
    return [by[key] for key in sorted(by)]


def global_shape(layout: Layout, shapes: Sequence[tuple[int, ...] | None],
                 coordinates: Sequence[tuple[int, ...]]) -> tuple[int, ...] | str:
    """The global shape the ranks' local ``shapes`` make under ``layout``, or the reason they do not fit it."""
    if layout.source == RANKWISE:
        if any(shape is None or shape != shapes[0] for shape in shapes):
            return "ranks hold shards of different shapes, compared rank by rank"
        assert shapes[0] is not None
        return (len(shapes), *shapes[0])

    def build(ranks: list[int], depth: int) -> tuple[int, ...] | str:
        if depth == len(layout.placements):
            shape = shapes[ranks[0]]
            return shape if shape is not None else "a rank recorded no shape"
        parts = [build(group, depth + 1) for group in _groups(coordinates, ranks, depth)]
        bad = next((p for p in parts if isinstance(p, str)), None)
        if bad is not None:
            return bad
        shaped = [p for p in parts if not isinstance(p, str)]
        kind, dim = layout.placements[depth]
        if kind != "S":
            if any(p != shaped[0] for p in shaped):
                return f"ranks hold shapes {sorted({list(p).__repr__() for p in shaped})} for a {kind} placement"
            return shaped[0]
        assert dim is not None
        ndim = len(shaped[0])
        axis = dim + ndim if dim < 0 else dim
        if not 0 <= axis < ndim:
            return f"S({dim}) names no dim of a {ndim}-dim tensor"
        if any(len(p) != ndim or p[:axis] + p[axis + 1:] != shaped[0][:axis] + shaped[0][axis + 1:] for p in shaped):
            return f"ranks' shards {[list(p) for p in shaped]} differ beyond dim {dim}"
        return (*shaped[0][:axis], sum(p[axis] for p in shaped), *shaped[0][axis + 1:])

    return build(list(range(len(shapes))), 0)


@dataclass(frozen=True)
class ReplicaDifference:
    """A rank whose copy of a replicated tensor differs from its group's first rank."""

    rank: int
    reference_rank: int
    max_abs_err: float


def rebuild(layout: Layout, load: Callable[[int], Payload], world: int,
            coordinates: Sequence[tuple[int, ...]]) -> tuple[Payload, list[ReplicaDifference]]:
    """The global tensor of ``layout`` from each rank's shard (``load(rank)``), and the replicas that differ.

    Memory: the global tensor, plus the shards being joined (memory-mapped). Partial sums are added in
    float64 and returned as float32 (float64 for float64 shards).
    """
    differences: list[ReplicaDifference] = []
    if layout.source == RANKWISE:
        parts = [load(rank) for rank in range(world)]
        _same_dtype(parts)
        if any(p.shape != parts[0].shape for p in parts):
            raise PayloadError(f"ranks hold shards of shapes {sorted({str(list(p.shape)) for p in parts})}")
        return Payload(np.stack([p.values for p in parts]), parts[0].dtype), differences

    def build(ranks: list[int], depth: int) -> tuple[Payload, int]:
        if depth == len(layout.placements):
            return load(ranks[0]), ranks[0]
        parts = [build(group, depth + 1) for group in _groups(coordinates, ranks, depth)]
        kind, dim = layout.placements[depth]
        first, first_rank = parts[0]
        _same_dtype([p for p, _ in parts])
        if kind == fmt.REPLICATE:
            for part, rank in parts[1:]:
                if not _alike(first, part):
                    differences.append(ReplicaDifference(rank, first_rank, _max_abs_err(first, part)))
            return first, first_rank
        if kind == fmt.PARTIAL:
            if any(p.shape != first.shape for p, _ in parts):  # numpy would broadcast a (64,) into [1, 12, 64]
                raise PayloadError(f"partial sums of shapes {sorted({str(list(p.shape)) for p, _ in parts})}")
            work = np.float64
            total = sum((as_floats(p.values, p.dtype, work) for p, _ in parts), np.zeros(first.shape, work))
            dtype = "float64" if first.dtype == "float64" else "float32"
            return Payload(np.asarray(total, dtype=np.float64 if dtype == "float64" else np.float32), dtype), first_rank
        assert dim is not None
        ndim = {len(p.shape) for p, _ in parts}
        if len(ndim) != 1 or not -min(ndim) <= dim < min(ndim):
            raise PayloadError(f"shards of {sorted(ndim)} dims cannot be joined along dim {dim}")
        try:
            joined = np.concatenate([p.values for p, _ in parts], axis=dim)
        except ValueError:  # sizes beyond the dim differ: each shard is checked against its record before
            raise PayloadError(f"shards of shapes {[list(p.shape) for p, _ in parts]} cannot be joined along dim "
                               f"{dim}") from None
        return Payload(joined, first.dtype), first_rank

    payload, _ = build(list(range(world)), 0)
    return payload, differences


def shard_spans(layout: Layout, shapes: Sequence[tuple[int, ...]], coordinates: Sequence[tuple[int, ...]]
                ) -> dict[int, tuple[slice, ...]] | None:
    """Where each rank's shard lies in the global tensor (1-D meshes without partial sums), or None."""
    if layout.source == RANKWISE:  # stacked: rank r's shard is index r of the leading dim
        return {rank: (slice(rank, rank + 1),) for rank in range(len(shapes))}
    if len(layout.placements) != 1 or layout.partial:
        return None
    kind, dim = layout.placements[0]
    order = sorted(range(len(shapes)), key=lambda rank: coordinates[rank][0])
    if kind == fmt.REPLICATE:
        return {rank: tuple(slice(None) for _ in shapes[rank]) for rank in order}
    assert dim is not None
    spans, start = {}, 0
    for rank in order:
        shape = shapes[rank]
        axis = dim + len(shape) if dim < 0 else dim
        spans[rank] = tuple(slice(start, start + shape[axis]) if i == axis else slice(None) for i in range(len(shape)))
        start += shape[axis]
    return spans


def _same_dtype(parts: Sequence[Payload]) -> None:
    """Refuse shards of other dtypes: joined, numpy would promote them (or mix bf16 bit patterns with floats)."""
    dtypes = {p.dtype for p in parts}
    if len(dtypes) > 1:
        raise PayloadError(f"ranks hold shards of dtypes {', '.join(sorted(dtypes))}")


def _bytes(values: np.ndarray) -> np.ndarray:
    """The bytes of ``values`` (a 0-d array too, which numpy cannot view as another dtype)."""
    return np.ascontiguousarray(values).reshape(-1).view(np.uint8)


def _alike(a: Payload, b: Payload) -> bool:
    """Bitwise equal (NaNs of one pattern included): the ranks of a replica ran the same kernels on the same data."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(_bytes(a.values), _bytes(b.values)))


def _max_abs_err(a: Payload, b: Payload) -> float:
    if a.shape != b.shape or not (is_floating(a.dtype) and is_floating(b.dtype)):
        return float("nan")
    with np.errstate(invalid="ignore"):
        diff = np.abs(as_floats(a.values, a.dtype, np.float64) - as_floats(b.values, b.dtype, np.float64))
    return float(np.nanmax(diff)) if diff.size else 0.0
