"""Comparing one matched tensor pair: from payloads when both exist, else from statistics."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from ..errors import TracediffError
from ..format import MOMENT_STAT_KEYS
from ..trace.load import Trace
from ..trace.model import TensorRecord
from .benign import exact_mismatches, is_exact_dtype, prepare_pair, squeezable, squeeze_note
from .metrics import PairMetrics, compare_tensors
from .raw_payload import identical_pair

_STAT_KEYS = MOMENT_STAT_KEYS  # the statistics compared with a tolerance when a payload is missing
NAN = math.nan


def compare_records(
    trace_a: Trace, ra: TensorRecord, trace_b: Trace, rb: TensorRecord, *, atol: float, rtol: float
) -> dict[str, Any]:
    """The metric fields of a row (status, reason and every metric) for one tensor pair."""
    if ra.shape is not None and rb.shape is not None and ra.shape != rb.shape and not squeezable(ra.shape, rb.shape):
        return _verdict("shape_mismatch", False, f"shape differs: {list(ra.shape)} vs {list(rb.shape)}")
    if ra.has_payload and rb.has_payload:
        same = identical_pair(trace_a, ra, trace_b, rb)  # bitwise-equal files: no decoding
        if same is not None:
            return _from_metrics(same, approximate=False, note=_dtype_note(ra, rb))
        try:
            a, b = trace_a.load(ra), trace_b.load(rb)
        except TracediffError as e:
            return _verdict("unreadable", None, str(e))
        if a.shape != b.shape and not squeezable(tuple(a.shape), tuple(b.shape)):
            return _verdict("shape_mismatch", False, f"shape differs: {list(a.shape)} vs {list(b.shape)}")
        stored = [_stored_dtype_note(side, r, t) for side, r, t in (("A", ra, a), ("B", rb, b))]
        a, b, notes = prepare_pair(a, b)
        notes = [*filter(None, stored), *notes]
        if is_exact_dtype(a.dtype) and is_exact_dtype(b.dtype):
            metrics = _compare_exact(a, b)
        else:
            metrics = compare_tensors(a, b, atol=atol, rtol=rtol)
        note = "; ".join(filter(None, [_dtype_note(ra, rb), *notes]))
        return _from_metrics(metrics, approximate=False, note=note)
    fields = compare_stats(ra, rb, atol=atol, rtol=rtol)
    if ra.shape != rb.shape and ra.shape is not None and rb.shape is not None:
        fields["reason"] += f"; {squeeze_note(ra.shape, rb.shape)}"
    return fields


def _compare_exact(a: torch.Tensor, b: torch.Tensor) -> PairMetrics:
    """Integer and bool pairs: metrics in float64, the verdict from an exact 64-bit comparison."""
    metrics = compare_tensors(a.to(torch.float64), b.to(torch.float64), atol=0.0, rtol=0.0)
    mismatched = exact_mismatches(a, b)
    if not mismatched:
        return metrics
    # beyond 2**53 float64 rounds neighbours together: the largest difference comes from int64 arithmetic
    diff = (a.to(torch.int64) - b.to(torch.int64)).abs().to(torch.float64)
    worst = float(diff.max())
    absa = a.to(torch.int64).abs().to(torch.float64)
    rel = math.inf if bool(((absa == 0) & (diff > 0)).any()) else float((diff / absa.clamp(min=1)).max())
    return replace(metrics, identical=False, mismatched=mismatched, max_abs_err=max(metrics.max_abs_err, worst),
                   required_atol=max(metrics.required_atol, worst), max_rel_err=max(metrics.max_rel_err, rel),
                   required_rtol=max(metrics.required_rtol, rel),
                   mismatch_fraction=mismatched / metrics.numel if metrics.numel else 0.0)


def _stored_dtype_note(side: str, record: TensorRecord, tensor: torch.Tensor) -> str:
    """Said in the row when a payload holds another dtype than its trace JSON states (a payload was replaced)."""
    if record.dtype is None or record.dtype.removeprefix("torch.") == str(tensor.dtype).removeprefix("torch."):
        return ""
    return f"{side}'s payload holds {tensor.dtype} but the trace says {record.dtype}"


def _dtype_note(ra: TensorRecord, rb: TensorRecord) -> str:
    return f"dtype differs: {ra.dtype} vs {rb.dtype} (compared in float64)" if ra.dtype != rb.dtype else ""


def _from_metrics(m: PairMetrics, *, approximate: bool, note: str = "") -> dict[str, Any]:
    if m.identical:
        status, reason = "identical", note
    elif m.within_tolerance:
        status, reason = "close", note
    else:
        parts = [f"{m.mismatched} of {m.numel} elements out of tolerance"]
        if m.nan_mismatch:
            parts.append(f"{m.nan_mismatch} NaN where the other side is not")
        if m.inf_mismatch:
            parts.append(f"{m.inf_mismatch} infinities that differ")
        status, reason = "diverged", "; ".join(parts + ([note] if note else []))
    return {
        "status": status, "reason": reason, "within_tolerance": m.within_tolerance, "approximate": approximate,
        "max_abs_err": m.max_abs_err, "max_rel_err": m.max_rel_err, "mean_abs_err": m.mean_abs_err,
        "rms_err": m.rms_err, "cosine": m.cosine, "mismatch_fraction": m.mismatch_fraction,
        "nan_mismatch": m.nan_mismatch, "inf_mismatch": m.inf_mismatch,
        "required_atol": m.required_atol, "required_rtol": m.required_rtol,
    }


def _verdict(status: str, within: bool | None, reason: str) -> dict[str, Any]:
    return {
        "status": status, "reason": reason, "within_tolerance": within, "approximate": False,
        "max_abs_err": NAN, "max_rel_err": NAN, "mean_abs_err": NAN, "rms_err": NAN, "cosine": NAN,
        "mismatch_fraction": NAN, "nan_mismatch": 0, "inf_mismatch": 0,
        "required_atol": NAN, "required_rtol": NAN,
    }


def compare_stats(ra: TensorRecord, rb: TensorRecord, *, atol: float, rtol: float) -> dict[str, Any]:
    """An approximate verdict from recorded statistics (mean, std, min, max, abs_mean).

    Each statistic of B must lie within ``atol + rtol * |statistic of A|`` of
    A's, plus the rounding of statistics parsed from transformers' strings
    (five significant digits, so ``5e-5 * |value|`` per side); ``max_abs_err``
    and ``max_rel_err`` are the largest differences among the statistics,
    ``required_atol``/``required_rtol`` what would pass beyond that rounding,
    and NaN/Inf counts must agree when both sides recorded them. The other
    metrics are NaN.
    """
    keys = [k for k in _STAT_KEYS if k in ra.stats and k in rb.stats]
    if not keys:
        missing = "A" if not ra.stats else "B"
        return _verdict("no_data", None, f"no payload and no statistics in {missing}")
    worst_abs, worst_rel, need_atol, need_rtol, failing = 0.0, 0.0, 0.0, 0.0, []
    for key in keys:
        va, vb = float(ra.stats[key]), float(rb.stats[key])
        if math.isnan(va) and math.isnan(vb) or va == vb or _overflowed(ra, key, va) or _overflowed(rb, key, vb):
            continue
        diff = abs(va - vb)
        if math.isnan(diff):
            diff = math.inf
        excess = max(0.0, diff - _rounding(ra, va) - _rounding(rb, vb))
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / abs(va) if va else math.inf)
        need_atol = max(need_atol, excess)
        need_rtol = max(need_rtol, excess / abs(va) if va else (math.inf if excess else 0.0))
        if not (math.isfinite(excess) and excess <= atol + rtol * abs(va)):
            failing.append(f"{key} {va:.6g} vs {vb:.6g}")
    counted = all(k in r.stats for r in (ra, rb) for k in ("nan", "posinf", "neginf"))
    nan_a, nan_b = int(ra.stats.get("nan", 0)), int(rb.stats.get("nan", 0))
    inf_a = int(ra.stats.get("posinf", 0)) + int(ra.stats.get("neginf", 0))
    inf_b = int(rb.stats.get("posinf", 0)) + int(rb.stats.get("neginf", 0))
    if not counted:  # transformers' traces record no counts: nothing to compare
        nan_a = nan_b = inf_a = inf_b = 0
    if nan_a != nan_b:
        failing.append(f"NaN count {nan_a} vs {nan_b}")
    if inf_a != inf_b:
        failing.append(f"Inf count {inf_a} vs {inf_b}")
    within = not failing
    reason = "compared on statistics only: " + (", ".join(failing) if failing else ", ".join(keys))
    stale = ra.stale_reason or rb.stale_reason
    if stale:
        reason += f" ({stale})"
    return {
        "status": "close" if within else "diverged",  # equal statistics do not prove equal tensors
        "reason": reason, "within_tolerance": within, "approximate": True,
        "max_abs_err": worst_abs, "max_rel_err": worst_rel, "mean_abs_err": NAN, "rms_err": NAN, "cosine": NAN,
        "mismatch_fraction": NAN, "nan_mismatch": abs(nan_a - nan_b), "inf_mismatch": abs(inf_a - inf_b),
        "required_atol": need_atol if nan_a == nan_b and inf_a == inf_b else math.inf,
        "required_rtol": need_rtol if nan_a == nan_b and inf_a == inf_b else math.inf,
    }


# transformers' debugger writes statistics as reprs with five significant digits ("tensor(1.2345e-02)");
# tracediff writes JSON numbers, always with a "numel" entry. A statistic parsed from a repr is known
# to half a unit of its last digit, which must not count as a difference between the two tensors.
_REPR_ROUNDING = 5e-5


def _overflowed(record: TensorRecord, key: str, value: float) -> bool:
    """A moment that is not finite while min and max are: computing the statistic overflowed, not the data.

    (transformers computes ``std`` of a float32 attention mask holding ``finfo.min`` as ``inf``.)
    """
    if key not in ("mean", "std", "abs_mean") or math.isfinite(value):
        return False
    bounds = [record.stats.get(k) for k in ("min", "max")]
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in bounds)


def _rounding(record: TensorRecord, value: float) -> float:
    """How far a recorded statistic can be from the exact one only because of how it was written."""
    if "numel" in record.stats or not math.isfinite(value):
        return 0.0
    return _REPR_ROUNDING * abs(value)
