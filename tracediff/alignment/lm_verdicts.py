"""Language-model verdicts on aligned rows: positions, PCC, and the next-token distribution.

For each pair with payloads on both sides (same shape), found in the
comparison's own pass (:mod:`tracediff.compare.row_pass`; a pair is read
again only in the cases :func:`annotate_rows` lists):

* ``pcc``: the Pearson correlation of its elements (1.0 for identical pairs);
* ``position`` / ``positions_beyond``: for a row out of tolerance with a
  sequence dimension (see :func:`tracediff.compare.positions.sequence_dim`),
  the first absolute token position holding an element beyond tolerance, and
  how many positions do. A decode step's positions start where its tokens sit
  in the generated sequence (:func:`tracediff.alignment.decode_steps.sequence_starts`);
* for logits rows (the root's ``outputs.logits``, and the outputs of modules
  matching ``logits=`` globs): KL per position, top-k agreement and argmax
  flips (:mod:`tracediff.compare.logits`), in the row (``kl_max``,
  ``top1_agreement``, ``top5_agreement``, ``top10_agreement``,
  ``argmax_flips``, ``flip_margin``) and in ``Alignment.logits``. With a
  baseline, a flip whose reference margin is at most twice the row's noise
  floor is ``benign``: the noise alone moves each of the two logits that far.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import format as fmt
from ..compare.logits import DEFAULT_TOP_K, logits_metrics, pearson
from ..compare.measurement import Measurement
from ..compare.positions import (
    PositionErrors,
    position_error_ratios,
    positions_beyond_tolerance,
    positions_of,
    sequence_dim,
)
from ..errors import TracediffError, UsageError
from ..globs import matches_any
from ..trace.load import Trace
from ..trace.model import Node, TensorRecord
from ..trace.payload import as_floats, is_complex
from .decode_steps import root_of_calls, sequence_starts
from .lm_results import FlipVerdict, LogitsVerdict, PositionStrip
from .pair import Pair
from .result import TensorComparison
from .rows import RowDraft
from .verdicts.apply import Runner

_LOGITS_SLOT = "outputs.logits"








@dataclass(frozen=True)
class TokenSpans:
    """Which tokens each call of a trace reads: ``(first absolute position, count)`` of the top-level call it ran
    under (``(0, None)`` when unknown). Built once per alignment: it walks the whole tree."""

    starts: Mapping[int, tuple[int, int | None]]
    roots: Mapping[tuple[str, int], int]

    @classmethod
    def of(cls, trace: Trace) -> TokenSpans:
        return cls(sequence_starts(trace), root_of_calls(trace))

    def of_call(self, node: Node) -> tuple[int, int | None]:
        index = self.roots.get((node.module_path, node.call_index))
        return self.starts.get(index, (0, None)) if index is not None else (0, None)

    def axis(self, node: Node, slot: str, shape: tuple[int, ...]) -> tuple[int, int] | None:
        """The sequence dimension of ``node``'s tensor of ``slot`` and ``shape``, and the position of its index 0."""
        return _sequence_axis(slot, shape, *self.of_call(node))

    def of_pair(self, pair: Pair) -> tuple[int, int] | None:
        """The sequence dimension of ``pair``'s tensor (B's side) and the position of its index 0."""
        return self.axis(pair.node_b, pair.record_b.slot, pair.record_b.shape or ())


def position_strip(row: TensorComparison, pair: Pair, a: Trace, b: Trace, spans: TokenSpans
                   ) -> PositionStrip | None:
    """The per-position errors of ``row`` (read from both payloads), or None when it has no sequence dimension;
    ``spans``: ``TokenSpans.of(b)``."""
    ra, rb = pair.record_a, pair.record_b
    if not (ra.has_payload and rb.has_payload) or ra.shape != rb.shape or row.approximate or row.op is not None:
        return None
    axis = spans.of_pair(pair)
    values = _read_pair(a, ra, b, rb) if axis is not None else None
    if values is None or axis is None:
        return None
    dim, first = axis
    ratios = position_error_ratios(values[0], values[1], atol=row.atol, rtol=row.rtol, dim=dim)
    return PositionStrip(row.order, first, tuple(float(r) for r in ratios))


def _sequence_axis(slot: str, shape: tuple[int, ...], start: int, length: int | None) -> tuple[int, int] | None:
    """The sequence dimension of a tensor of ``slot`` and ``shape`` and the absolute position of its index 0.

    A call reading ``length`` tokens from position ``start``: the dimension of that size (``sequence_dim``).
    A cache layer's keys or values: dimension -2, the positions before the step, from 0. None: no sequence.
    """
    if len(shape) < 2:
        return None
    if fmt.is_cache_slot(slot):
        return len(shape) - 2, 0
    dim = sequence_dim(shape, length) if length is not None else None
    return None if dim is None else (dim, start)


def check_logits_patterns(logits: str | Sequence[str] | None) -> tuple[str, ...]:
    """``logits=`` as a tuple of module-path globs; UsageError for anything else."""
    if logits is None:
        return ()
    patterns = (logits,) if isinstance(logits, str) else tuple(logits)
    if not all(isinstance(p, str) and p for p in patterns):
        raise UsageError(f"logits={logits!r}: expected module-path globs such as 'lm_head'")
    return patterns


def is_logits_row(row: TensorComparison, relative_path: str, patterns: tuple[str, ...]) -> bool:
    if row.tensor == _LOGITS_SLOT and not relative_path:
        return True
    return row.tensor.startswith("outputs") and matches_any(relative_path, patterns)


def _set(row: RowDraft, **fields: Any) -> None:
    for name, value in fields.items():
        setattr(row, name, value)


def sequence_axes(spans: TokenSpans) -> Callable[[Node, TensorRecord], int | None]:
    """``axis(node, record)``: the sequence dimension of B's tensor ``record`` of call ``node`` (None: none),
    so that the comparison finds the positions out of tolerance in the same pass as the metrics."""
    def axis(node: Node, record: TensorRecord) -> int | None:
        if not record.has_payload or not record.shape:
            return None
        found = spans.axis(node, record.slot, record.shape)
        return None if found is None else found[0]

    return axis


def _from_pass(row: RowDraft, measurement: Measurement | None, logits_row: bool) -> bool:
    """True when the comparison's own pass found what the row needs (no second read of its payloads)."""
    return (measurement is not None and measurement.pcc is not None and not logits_row
            and (row.within_tolerance is not False or measurement.positions is not None))


def reread_pairs(rows: Sequence[RowDraft], pairs: Sequence[Pair], measurements: Sequence[Measurement | None],
                 logits: tuple[str, ...], measured_apart: Container[int] = ()) -> list[Pair]:
    """The pairs ``annotate_rows`` reads again: logits rows, and rows whose comparison could not annotate them
    (never a row ``measured_apart``, by order: its pair is not read whole)."""
    again = []
    for row in rows:
        if row.order >= len(pairs) or row.op is not None or row.order in measured_apart:
            continue
        pair = pairs[row.order]
        logits_row = is_logits_row(row, pair.node_b.relative_path, logits)
        if (row.status != "identical" or logits_row) and not _from_pass(row, measurements[row.order], logits_row):
            again.append(pair)
    return again


def annotate_rows(rows: Sequence[RowDraft], pairs: Sequence[Pair], a: Trace, b: Trace, *,
                  logits: tuple[str, ...] = (), run: Runner | None = None,
                  measurements: Sequence[Measurement | None] = (),
                  measured_apart: Mapping[int, tuple[float, np.ndarray | None]] | None = None,
                  spans: TokenSpans) -> tuple[LogitsVerdict, ...]:
    """Fill ``pcc``, ``position``, ``positions_beyond`` and the logits columns of ``rows`` (still being built);
    returns the logits verdicts. ``pairs[row.order]`` is the pair a row compared. ``run(fn, items)`` maps
    ``fn`` over the rows (the alignment's worker threads: each row is read and annotated on its own).

    ``measurements[row.order]``, when given, is what comparing the pair found: its ``pcc`` and
    ``positions`` (see :mod:`tracediff.compare.row_pass`) are used as they are. Only the rows they do not
    cover are read again: logits rows (KL and top-k need whole positions), pairs compared from statistics or
    through a layout, integer pairs, and the rare pair whose pcc the pass could not vouch for.

    ``measured_apart``: for rows measured in parts where their shards live (``align(..., distributed=True)``),
    by row order, the Pearson correlation and the positions along the sequence dimension holding an element
    out of tolerance (None: none); those pairs are not read again, so they get no logits verdict.
    ``spans``: ``TokenSpans.of(b)``.
    """

    def annotate(row: RowDraft) -> LogitsVerdict | None:
        if row.order >= len(pairs) or row.op is not None:
            return None
        pair = pairs[row.order]
        ra, nb, rb = pair.record_a, pair.node_b, pair.record_b
        logits_row = is_logits_row(row, nb.relative_path, logits)
        if row.status == "identical":
            _set(row, pcc=1.0, positions_beyond=0)
            if not logits_row:
                return None
        start, length = spans.of_call(nb)
        cache = fmt.is_cache_slot(rb.slot)  # the positions before the step (see _sequence_axis)
        if length == 1 and row.within_tolerance is False and not cache:  # one token read: every error is there
            _set(row, position=start, positions_beyond=1)
        if not (ra.has_payload and rb.has_payload) or ra.shape != rb.shape or row.approximate:
            return None
        span = (start, length)
        if measured_apart is not None and row.order in measured_apart:
            pcc, beyond = measured_apart[row.order]
            _set(row, pcc=pcc)
            _mark_positions(row, rb.slot, rb.shape or (), span,
                            lambda dim: positions_of(beyond if beyond is not None else np.zeros(0, bool), dim))
            return None
        measurement = measurements[row.order] if row.order < len(measurements) else None
        if measurement is not None and _from_pass(row, measurement, logits_row):
            _set(row, pcc=measurement.pcc)
            _mark_positions(row, rb.slot, rb.shape or (), span, lambda dim: measurement.positions)
            return None
        values = _read_pair(a, ra, b, rb)
        if values is None:
            return None
        va, vb = values
        _set(row, pcc=pearson(va, vb))
        _mark_positions(row, rb.slot, va.shape, span,
                        lambda dim: positions_beyond_tolerance(va, vb, atol=row.atol, rtol=row.rtol, dim=dim))
        if logits_row and va.ndim >= 1 and va.shape[-1] > 1:
            return _logits_verdict(row, va, vb, start if length is not None else 0)
        return None

    mapped = run(annotate, list(rows)) if run is not None else [annotate(row) for row in rows]
    return tuple(verdict for verdict in mapped if verdict is not None)


def _mark_positions(row: RowDraft, slot: str, shape: tuple[int, ...], span: tuple[int, int | None],
                    found: Callable[[int], PositionErrors | None]) -> None:
    """``positions_beyond`` of a row: 0 within tolerance; out of tolerance, the positions ``found(dim)`` gives
    along the sequence dimension of its tensor (none: left unset), read by the call's token ``span``."""
    if row.within_tolerance is True:
        _set(row, positions_beyond=0)
        return
    axis = _sequence_axis(slot, shape, *span) if row.within_tolerance is False else None
    errors = found(axis[0]) if axis is not None else None
    if axis is not None and errors is not None:
        _set_positions(row, axis[1], errors)


def _set_positions(row: RowDraft, first: int, found: PositionErrors) -> None:
    """The row's first absolute position out of tolerance (``first``: the absolute position of index 0)."""
    _set(row, position=None if found.first is None else first + found.first, positions_beyond=found.count)


def _read_pair(a: Trace, ra: Any, b: Trace, rb: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """Both payloads as float64 arrays, or None when they are not floating or cannot be read."""
    try:
        pa, pb = a.load_payload(ra), b.load_payload(rb)
    except TracediffError:  # the row already says the payload is unreadable
        return None
    if is_complex(pa.dtype) or is_complex(pb.dtype) or pa.shape != pb.shape:
        return None
    return as_floats(pa.values, pa.dtype, np.float64), as_floats(pb.values, pb.dtype, np.float64)


def _logits_verdict(row: RowDraft, va: np.ndarray, vb: np.ndarray, start: int) -> LogitsVerdict:
    found = logits_metrics(va, vb, top_k=DEFAULT_TOP_K)
    floor = row.noise_floor
    flips = tuple(FlipVerdict(start + f.position, f.token_a, f.token_b, f.margin,
                              None if floor is None or not math.isfinite(floor) else f.margin <= 2 * floor)
                  for f in found.flips)
    _set(row, kl_max=found.kl_max, top1_agreement=found.topk_agreement.get(1),
         top5_agreement=found.topk_agreement.get(5), top10_agreement=found.topk_agreement.get(10),
         argmax_flips=len(flips), flip_margin=flips[0].margin if flips else None)
    return LogitsVerdict(row.order, row.module_path_b, row.tensor, row.step, found.kl, found.topk_agreement, flips)
