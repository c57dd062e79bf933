"""A multi-rank run presented as one global trace: ``load_sharded`` and ``ShardedTrace``.

The call tree is rank 0's (every rank must have made the same calls; op nodes of an op-level capture are
left out: they hold rank-local work, masks and offsets, with no global tensor to rebuild); each
tensor record becomes the global tensor's record: its global shape, and a
payload rebuilt from the ranks' shards when it is read
(:func:`tracediff.sharding.layout.rebuild`), one tensor at a time. Where a
tensor's layout comes from, strongest first: the trace (a DTensor's
placements, a parallel style's), a ``--shards`` rule, and otherwise the
evidence of the values (:meth:`ShardedTrace.place_against`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .. import format as fmt
from ..errors import PayloadError, TraceFormatError
from ..trace.load import Trace
from ..trace.model import Node, TensorRecord
from .findings import ShardFinding
from .folder import RankSet, read_ranks
from .layout import RANKWISE, Layout, global_shape, parse_layout, rebuild, shard_spans
from .stats import combined_stats

if TYPE_CHECKING:
    from ..trace.payload import Payload
    from .rules import ShardRules

#: Placements of a tensor recorded without a layout whose ranks hold the same shape: a replica, checked.
_UNRECORDED = "unrecorded"


@dataclass(frozen=True)
class Placed:
    """One global tensor: its layout (None: not placed, ``reason`` says why) and each rank's record of it."""

    layout: Layout | None
    shards: tuple[TensorRecord, ...]
    node: Node
    reason: str = ""


@dataclass
class ShardedTrace(Trace):
    """The global trace of a multi-rank folder (see the module docstring)."""

    sharded: ClassVar[bool] = True

    ranks: RankSet | None = field(default=None, repr=False, compare=False)
    placed: dict[int, Placed] = field(default_factory=dict, repr=False, compare=False)
    _found: dict[tuple[int, int, str], ShardFinding] = field(default_factory=dict, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # replicated records whose copies were checked alike across ranks: read from rank 0 alone afterwards
    _checked: set[int] = field(default_factory=set, repr=False, compare=False)

    @property
    def world_size(self) -> int:
        return len(self.ranks.traces) if self.ranks is not None else 1

    @property
    def findings(self) -> tuple[ShardFinding, ...]:
        """What the shards said on their own: unplaced tensors, replicas the ranks disagree on (in trace order)."""
        with self._lock:
            return tuple(self._found[key] for key in sorted(self._found))

    def payload_path(self, record: TensorRecord) -> Path:
        raise PayloadError(f"{self.directory}: {record.slot} is rebuilt from {self.world_size} ranks' shards")

    def load_payload(self, record: TensorRecord) -> Payload:
        """The global tensor of ``record``, rebuilt from the ranks' shards; replicas are checked alike."""
        placed = self.placed.get(record.order)
        if placed is None or placed.layout is None or self.ranks is None:
            raise PayloadError(f"{self.directory}: {record.slot}: {placed.reason if placed else 'not placed'}")
        if placed.layout.replicated and record.order in self._checked:  # read again (pcc, positions): one copy
            return self._shard(placed, 0)
        payload, differences = self._rebuild(placed)
        if placed.layout.replicated:
            self.mark_replica_checked(record)
        for diff in differences:
            self.note_replica_difference(record, diff.rank, diff.reference_rank, f"max_abs_err={diff.max_abs_err:.3g}")
        return payload

    def note_replica_difference(self, record: TensorRecord, rank: int, reference_rank: int, seen: str) -> None:
        """List a replicated ``record`` whose copy on ``rank`` differs from ``reference_rank``'s (``seen``: how
        far, in the finding's parentheses)."""
        placed = self.placed[record.order]
        unrecorded = placed.layout is not None and placed.layout.source == _UNRECORDED
        kind = "ranks_disagree" if unrecorded else "replica_differs"
        what = "recorded without a layout, it" if unrecorded else "a replicated tensor, it"
        self._add(ShardFinding(kind, placed.node.module_path, placed.node.call_index, record.slot, rank,
                               f"{what} differs on rank {rank} from rank {reference_rank} ({seen})"), record.order)

    def mark_replica_checked(self, record: TensorRecord) -> None:
        """Read the replicated ``record`` from rank 0 alone from now on: its copies were compared elsewhere
        (``align(..., distributed=True)`` compares their digests)."""
        with self._lock:
            self._checked.add(record.order)

    def local_shard(self, record: TensorRecord, rank: int) -> Payload:
        """Rank ``rank``'s own shard (or copy) of the global tensor ``record``, read from its rank folder alone."""
        placed = self.placed.get(record.order)
        if placed is None or self.ranks is None:
            raise PayloadError(f"{self.directory}: {record.slot}: not placed")
        return self._shard(placed, rank)

    def load(self, record: TensorRecord) -> Any:
        raise PayloadError(f"{self.directory}: a sharded trace is read as numpy payloads only ({record.slot})")

    @property
    def incomplete_reason(self) -> str | None:
        if self.ranks is None:
            return None
        for rank, trace in enumerate(self.ranks.traces):
            reason = trace.incomplete_reason
            if reason is not None:
                return f"rank {rank}: {reason}"
        return None

    def shard_views(self, record: TensorRecord) -> list[tuple[int, tuple[slice, ...], Callable[[], Payload] | None]]:
        """Each rank (in mesh order) with its shard's slice of the global tensor of ``record`` and, for a
        replica, the reader of that rank's own copy (None: the slice of the rebuilt tensor is the shard).
        Empty for partial sums, N-D meshes and unplaced tensors."""
        placed = self.placed.get(record.order)
        if placed is None or placed.layout is None or self.ranks is None:
            return []
        shapes = [shard.shape for shard in placed.shards]
        known = [shape for shape in shapes if shape is not None]
        spans = shard_spans(placed.layout, known, self.ranks.coordinates) if len(known) == len(shapes) else None
        if spans is None:
            return []
        def reader(rank: int) -> Callable[[], Payload]:
            return lambda: self._shard(placed, rank)

        replica = placed.layout.replicated
        return [(rank, span, reader(rank) if replica else None) for rank, span in spans.items()]

    def place_against(self, other: Trace, *, closeness: Any) -> None:
        """Place, on the evidence of ``other``'s values, the tensors recorded without a layout: a tensor whose
        ranks hold other shapes than ``other``'s tensor at the same call and slot is tried as shards
        concatenated along each dim where their sizes add up; ``closeness(rebuilt, theirs)`` says whether that
        reproduces ``other``'s value. One that fits nowhere stays unplaced and is listed (never compared)."""
        if self.ranks is None or len(self.ranks.mesh_shape) != 1:
            return
        theirs = {(node.key, node.op_index, record.slot): record for node in every_node(other)
                  for record in node.tensors}
        for node in self.nodes():
            for i, record in enumerate(node.tensors):
                placed = self.placed.get(record.order)
                counterpart = theirs.get((node.key, node.op_index, record.slot))
                if placed is None or counterpart is None:
                    continue
                if counterpart.shape is None:
                    if placed.layout is None:  # nothing to place it by: listed, so that it fails to pass
                        node.tensors[i] = self._unplaced(record, placed, "no layout recorded or declared, and the "
                                                         "other trace's tensor has no shape to place it by")
                    continue
                if placed.layout is not None and placed.layout.source != _UNRECORDED:
                    continue
                shapes = [s.shape for s in placed.shards]
                if placed.layout is not None and shapes[0] == counterpart.shape:
                    if _unrecorded(other, counterpart) and not self._ranks_agree(record, placed):
                        # neither side says where it lives, and the ranks differ: a shard or a bad replica
                        node.tensors[i] = self._unplaced(record, placed, "no layout recorded or declared in "
                                                         "either trace, and the ranks hold different values")
                    continue  # a replica by shape and values, checked when read
                node.tensors[i] = self._place_by_value(record, placed, counterpart, other, closeness)

    def place_rankwise(self, other: ShardedTrace) -> None:
        """Compare rank by rank the tensors that neither this trace nor ``other`` (a sharded trace of the same
        mesh) places: each rank's shard against the same rank's shard of ``other``, where every rank holds a
        shard of one shape in both traces. A tensor whose ranks hold one copy in both traces stays a replica
        (checked alike); one whose ranks differ on either side would otherwise be left unplaced, never compared."""
        mine, theirs = self.ranks, other.ranks
        if mine is None or theirs is None or mine.mesh_shape != theirs.mesh_shape or \
                mine.coordinates != theirs.coordinates:
            return
        records = {(node.key, node.op_index, record.slot): (node, i) for node in every_node(other)
                   for i, record in enumerate(node.tensors)}
        for node in self.nodes():
            for i, record in enumerate(node.tensors):
                found = records.get((node.key, node.op_index, record.slot))
                if found is None:
                    continue
                other_node, j = found
                other_record = other_node.tensors[j]
                placed, counterpart = self.placed.get(record.order), other.placed.get(other_record.order)
                if placed is None or counterpart is None or not (_unlaid(placed) and _unlaid(counterpart)):
                    continue
                shapes = [shard.shape for shard in placed.shards]
                if None in shapes or shapes != [shard.shape for shard in counterpart.shards] or \
                        any(shape != shapes[0] for shape in shapes):
                    continue
                if placed.layout is not None and counterpart.layout is not None and \
                        self._ranks_agree(record, placed) and other._ranks_agree(other_record, counterpart):
                    continue  # a replica on both sides: checked alike, read from rank 0
                node.tensors[i] = self._rankwise(record, placed)
                other_node.tensors[j] = other._rankwise(other_record, counterpart)

    def _rankwise(self, record: TensorRecord, placed: Placed) -> TensorRecord:
        layout = Layout((("S", 0),), RANKWISE)
        self.placed[record.order] = Placed(layout, placed.shards, placed.node)
        shape = global_shape(layout, [shard.shape for shard in placed.shards], ())
        assert not isinstance(shape, str)
        payload = placed.shards[0].payload if all(shard.has_payload for shard in placed.shards) else None
        # stacked in rank order: the statistics of a concatenation
        return replace(record, shape=shape, payload=payload, stats=combined_stats([s.stats for s in placed.shards]))

    def _ranks_agree(self, record: TensorRecord, placed: Placed) -> bool:
        """Whether every rank holds the same copy of the replica ``record`` (then read from rank 0 alone)."""
        try:
            _, differences = self._rebuild(placed)
        except (PayloadError, TraceFormatError):
            return True  # unreadable: its row says so
        if not differences:
            self.mark_replica_checked(record)
        return not differences

    def _rebuild(self, placed: Placed) -> tuple[Payload, list[Any]]:
        """The global tensor of ``placed`` from every rank's shard, and where replicated copies differ."""
        ranks, layout = self.ranks, placed.layout
        assert ranks is not None and layout is not None
        try:
            return rebuild(layout, lambda r: self._shard(placed, r), self.world_size, ranks.coordinates)
        except PayloadError as e:
            if str(e).startswith(str(self.directory)):  # a shard's own problem, naming its file
                raise
            raise PayloadError(f"{self.directory}: {placed.node.module_path} (call {placed.node.call_index}) "
                               f"{placed.shards[0].slot}: {e}") from None

    def _shard(self, placed: Placed, rank: int) -> Payload:
        """Rank ``rank``'s payload of ``placed``, checked against that rank's record before any use: a shard of
        another shape or dtype would be joined, summed or broadcast into a global tensor its record never held."""
        assert self.ranks is not None
        trace, record = self.ranks.traces[rank], placed.shards[rank]
        payload = trace.load_payload(record)
        stated = record.dtype.removeprefix("torch.") if record.dtype is not None else None
        if record.shape is None or payload.shape != record.shape or payload.dtype != stated:
            raise PayloadError(f"{trace.payload_path(record)}: holds {payload.dtype} {list(payload.shape)} but rank "
                               f"{rank}'s trace says {record.dtype} "
                               f"{list(record.shape) if record.shape is not None else 'no shape'}")
        return payload

    def _place_by_value(self, record: TensorRecord, placed: Placed, counterpart: TensorRecord, other: Trace,
                        closeness: Any) -> TensorRecord:
        assert self.ranks is not None
        target = counterpart.shape
        assert target is not None
        tried = []
        for dim in range(len(target)):
            layout = Layout((("S", dim),), "value")
            shape = global_shape(layout, [s.shape for s in placed.shards], self.ranks.coordinates)
            if shape != target:
                continue
            tried.append(dim)
            candidate = Placed(layout, placed.shards, placed.node)
            self.placed[record.order] = candidate
            try:
                fits = closeness(self.load_payload(replace(record, shape=target)), other.load_payload(counterpart))
            except (PayloadError, TraceFormatError):
                fits = False
            if fits:
                return replace(record, shape=target, payload=placed.shards[0].payload, stats={})
        reason = (f"no layout recorded or declared, and its shards concatenated along dim "
                  f"{' or '.join(map(str, tried))} do not reproduce the other trace's value" if tried else
                  "no layout recorded or declared, and no dim along which its shards add up to the other trace's "
                  f"shape {list(target)}")
        return self._unplaced(record, placed, reason)

    def _unplaced(self, record: TensorRecord, placed: Placed, reason: str) -> TensorRecord:
        """``record`` left unplaced, listed with ``reason``: no shape, no payload, never compared."""
        self.placed[record.order] = Placed(None, placed.shards, placed.node, reason)
        self._add(ShardFinding("unplaced", placed.node.module_path, placed.node.call_index, record.slot, None,
                               reason), record.order)
        return replace(record, shape=None, payload=None, stats={})

    def _add(self, finding: ShardFinding, order: int) -> None:
        with self._lock:
            self._found.setdefault((order, finding.rank if finding.rank is not None else -1, finding.kind), finding)


def every_node(trace: Trace) -> list[Node]:
    """Every node of ``trace``, each module call followed by its op nodes (op-level capture)."""
    return [each for node in trace.nodes() for each in (node, *node.ops)]


def _unlaid(placed: Placed) -> bool:
    """No layout recorded or declared: not placed, or a replica by shape alone."""
    return placed.layout is None or placed.layout.source == _UNRECORDED


def _unrecorded(trace: Trace, record: TensorRecord) -> bool:
    """True when ``record`` of a sharded ``trace`` has no layout of its own (a replica by shape only)."""
    if not isinstance(trace, ShardedTrace):
        return False
    placed = trace.placed.get(record.order)
    return placed is not None and (placed.layout is None or placed.layout.source == _UNRECORDED)


def load_sharded(path: str | Path, *, shards: ShardRules | None = None) -> ShardedTrace:
    """The global trace of the multi-rank folder ``path`` (see :func:`tracediff.sharding.folder.read_ranks` for
    what is refused); ``shards``: declared layouts for tensors the trace recorded without one (then
    ``shards.check_used()`` refuses a rule that matched nothing)."""
    ranks = read_ranks(path)
    first = ranks.traces[0]
    per_rank = [trace.nodes() for trace in ranks.traces]
    for nodes in per_rank:  # op nodes hold rank-local work (masks, offsets): no global tensor to rebuild
        for node in nodes:
            node.ops = []
    for rank, nodes in enumerate(per_rank[1:], start=1):
        if len(nodes) != len(per_rank[0]):
            raise TraceFormatError(f"{ranks.folder}: rank {rank} recorded {len(nodes)} calls, rank 0 "
                                   f"{len(per_rank[0])}: not one run of the same model")
    trace = ShardedTrace(directory=ranks.folder, json_path=first.json_path, roots=first.roots,
                         metadata=first.metadata, backward=first.backward, root_steps=first.root_steps,
                         root_tokens=first.root_tokens, ranks=ranks)
    for index, node in enumerate(per_rank[0]):
        others = [nodes[index] for nodes in per_rank]
        for rank, other in enumerate(others):
            if other.key != node.key or [t.slot for t in other.tensors] != [t.slot for t in node.tensors]:
                raise TraceFormatError(f"{ranks.folder}: rank {rank}'s call {other.module_path} (call "
                                       f"{other.call_index}) differs from rank 0's {node.module_path} (call "
                                       f"{node.call_index}): not one run of the same model")
        for i, record in enumerate(node.tensors):
            declared = shards.layout_for(node.relative_path, record.slot, ranks.dim_names) if shards else None
            node.tensors[i] = _global_record(trace, ranks, node, record, tuple(o.tensors[i] for o in others),
                                             declared)
    return trace


def _global_record(trace: ShardedTrace, ranks: RankSet, node: Node, record: TensorRecord,
                   shards: tuple[TensorRecord, ...], declared: Layout | None) -> TensorRecord:
    mesh_dims = len(ranks.mesh_shape)
    entry = ranks.traces[0].layouts.get(record.order)
    layout = parse_layout(entry, mesh_dims) if entry is not None else declared  # the trace's word first
    if entry is not None and layout is None:
        shown = repr(entry) if len(repr(entry)) <= 80 else repr(entry)[:77] + "..."
        raise TraceFormatError(f"{ranks.folder / 'rank0'}: {node.module_path} {record.slot}: layout {shown} "
                               f"is not one placement per dimension of the {mesh_dims}-D mesh")
    shapes = [shard.shape for shard in shards]
    if layout is None:
        if all(shape == shapes[0] for shape in shapes):
            layout = Layout(((fmt.REPLICATE, None),) * mesh_dims, _UNRECORDED)
        else:
            trace.placed[record.order] = Placed(None, shards, node, "no layout recorded or declared")
            return replace(record, shape=None, payload=None, stats={})
    return _placed_record(trace, ranks, node, record, shards, layout)


def _placed_record(trace: ShardedTrace, ranks: RankSet, node: Node, record: TensorRecord,
                   shards: tuple[TensorRecord, ...], layout: Layout) -> TensorRecord:
    shape = global_shape(layout, [shard.shape for shard in shards], ranks.coordinates)
    where = f"{ranks.folder}: {node.module_path} (call {node.call_index}) {record.slot}"
    if isinstance(shape, str):
        raise TraceFormatError(f"{where}: layout {layout.describe()} does not fit the ranks' shards: {shape}")
    if layout.global_shape is not None and layout.global_shape != shape:
        raise TraceFormatError(f"{where}: layout {layout.describe()} does not fit the global shape "
                               f"{list(layout.global_shape)}: its shards make {list(shape)}")
    trace.placed[record.order] = Placed(layout, shards, node)
    payload = record.payload if all(shard.has_payload for shard in shards) else None
    # a capture without payloads is compared on these: a replica's own, or the slices' combined; a sum's unknown
    stats = record.stats if layout.replicated else {} if layout.partial else \
        combined_stats([shard.stats for shard in shards])
    return replace(record, shape=shape, payload=payload, stats=stats)
