"""Comparing a matched tensor pair from its payloads, decoded with numpy (:mod:`tracediff.trace.payload`)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import PayloadFormatError, TracediffError
from ..trace.load import Trace
from ..trace.model import TensorRecord
from ..trace.payload import Payload, is_complex, payload_of
from .benign import MASKED_SCORE_AT, exact_mismatches, is_exact_dtype, prepare_pair
from .masks import as_masks, may_be_mask
from .measurement import Measurement, dtype_note, measured, unmeasured
from .metrics import PairMetrics, compare_tensors, measure_tensors
from .raw_payload import identical_pair
from .shapes import squeezable


def compare_payloads(
    trace_a: Trace, ra: TensorRecord, trace_b: Trace, rb: TensorRecord, *, atol: float, rtol: float,
    along: int | None = None,
) -> Measurement:
    """The measurement of a pair whose two tensors both have payloads (read one pair at a time).

    A floating pair of one shape, neither side complex, also gets its ``pcc`` and, with ``along`` (a
    dimension of that shape), the positions along it out of tolerance, found in the same pass
    (:func:`tracediff.compare.metrics.measure_tensors`).
    """
    same = identical_pair(trace_a, ra, trace_b, rb)  # bitwise-equal files: no decoding
    if same is not None:
        return measured(same, approximate=False, note=dtype_note(ra, rb))
    try:
        a, b = trace_a.load_payload(ra), trace_b.load_payload(rb)
    except PayloadFormatError:
        raise  # a trace that breaks the format is refused whole, not reported as one unreadable row
    except TracediffError as e:
        return unmeasured("unreadable", None, str(e))
    # attention masks in other conventions or layouts: compared as masked positions (statistics rule most out)
    masks = as_masks(a, b) if may_be_mask(ra.dtype, ra.stats) and may_be_mask(rb.dtype, rb.stats) else None
    if masks is not None:
        masked_a, masked_b = (Payload(np.ascontiguousarray(m), "bool") for m in (masks.a, masks.b))
        return measured(_compare_exact(masked_a, masked_b), approximate=False, note=masks.note)
    if a.shape != b.shape and not squeezable(a.shape, b.shape):
        return unmeasured("shape_mismatch", False, f"shape differs: {list(a.shape)} vs {list(b.shape)}")
    stored = [_stored_note(side, r, t) for side, r, t in (("A", ra, a), ("B", rb, b))]
    # the row's annotations come from this pass when the values are the payloads' own (else they are read again)
    plain = a.shape == b.shape and not (is_complex(a.dtype) or is_complex(b.dtype))
    recorded = (ra.stats.get("min"), ra.stats.get("max"))  # (5 digits in a standard trace: far enough)
    # positions masked on one side only: the statistics rule most tensors out, with no pass over them
    a, b, pair_notes, (only_a, only_b) = prepare_pair(a, b, recorded_a=recorded,
                                                      one_side=_may_be_masked(ra) or _may_be_masked(rb))
    notes = [*filter(None, stored), *pair_notes]
    note = "; ".join(filter(None, [dtype_note(ra, rb), *notes]))
    if is_exact_dtype(a.dtype) and is_exact_dtype(b.dtype):
        return measured(_compare_exact(a, b), approximate=False, note=note)
    if only_a or only_b:  # counted in positions, never measured; the row's annotations are read again
        return measured(_mask_difference(compare_tensors(a, b, atol=atol, rtol=rtol), only_a, only_b),
                        approximate=False, note=note)
    if not plain:
        return measured(compare_tensors(a, b, atol=atol, rtol=rtol), approximate=False, note=note)
    if along is not None and a.shape != tuple(rb.shape or ()):  # a replaced payload: positions are read again
        along = None
    metrics, extras = measure_tensors(a, b, atol=atol, rtol=rtol, along=along)
    return replace(measured(metrics, approximate=False, note=note), pcc=extras.pcc, positions=extras.positions)


def _compare_exact(a: Any, b: Any) -> PairMetrics:
    """Integer and bool pairs (payloads, arrays or tensors): metrics in float64, the verdict from an exact 64-bit
    comparison."""
    a, b = payload_of(a), payload_of(b)
    metrics = compare_tensors(a.values.astype(np.float64), b.values.astype(np.float64), atol=0.0, rtol=0.0)
    mismatched = exact_mismatches(a, b)
    if not mismatched:
        return metrics
    # beyond 2**53 float64 rounds neighbours together: the largest difference comes from int64 arithmetic
    ia, ib = a.values.astype(np.int64).reshape(-1), b.values.astype(np.int64).reshape(-1)
    diff = np.abs(ia - ib).astype(np.float64)
    worst = float(diff.max())
    absa = np.abs(ia).astype(np.float64)
    rel = math.inf if bool(((absa == 0) & (diff > 0)).any()) else float((diff / np.maximum(absa, 1)).max())
    return replace(metrics, identical=False, mismatched=mismatched, max_abs_err=max(metrics.max_abs_err, worst),
                   required_atol=max(metrics.required_atol, worst), max_rel_err=max(metrics.max_rel_err, rel),
                   required_rtol=max(metrics.required_rtol, rel),
                   mismatch_fraction=mismatched / metrics.numel if metrics.numel else 0.0)


def _may_be_masked(record: TensorRecord) -> bool:
    """Can the tensor hold a masked score (its recorded ``min`` at most ``-5e3``, or no ``min`` recorded)?"""
    low = record.stats.get("min")
    return not isinstance(low, (int, float)) or not low > MASKED_SCORE_AT


def _mask_difference(metrics: PairMetrics, only_a: int, only_b: int) -> PairMetrics:
    """Positions masked on one side only are out of tolerance whatever the tolerance: counted, never measured
    (their 3.4e38 would hide every other error); the errors are the other positions'."""
    mismatched = metrics.mismatched + only_a + only_b
    return replace(metrics, identical=False, mismatched=mismatched, required_atol=math.inf,
                   required_rtol=math.inf, mismatch_fraction=mismatched / metrics.numel if metrics.numel else 0.0)


def _stored_note(side: str, record: TensorRecord, payload: Payload) -> str:
    """Said in the row when a payload holds another dtype or shape than its trace JSON states (a payload was
    replaced): the values compared are the payload's."""
    notes = []
    if record.dtype is not None and record.dtype.removeprefix("torch.") != payload.dtype:
        notes.append(f"{side}'s payload holds torch.{payload.dtype} but the trace says {record.dtype}")
    if record.shape is not None and record.shape != payload.shape:
        notes.append(f"{side}'s payload holds shape {list(payload.shape)} but the trace says {list(record.shape)}")
    return "; ".join(notes)
