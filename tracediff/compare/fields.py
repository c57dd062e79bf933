"""The fields a row's measurement contributes: metric values, a verdict, a dtype note.

Shared by the statistics path (:mod:`tracediff.compare.records`) and the payload
path (:mod:`tracediff.compare.payloads`), so that neither imports the other.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..trace.model import TensorRecord

if TYPE_CHECKING:
    from .metrics import PairMetrics

NAN = math.nan

def dtype_note(ra: TensorRecord, rb: TensorRecord) -> str:
    return f"dtype differs: {ra.dtype} vs {rb.dtype} (compared in float64)" if ra.dtype != rb.dtype else ""


def metric_fields(m: PairMetrics, *, approximate: bool, note: str = "") -> dict[str, Any]:
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


def verdict_fields(status: str, within: bool | None, reason: str) -> dict[str, Any]:
    return {
        "status": status, "reason": reason, "within_tolerance": within, "approximate": False,
        "max_abs_err": NAN, "max_rel_err": NAN, "mean_abs_err": NAN, "rms_err": NAN, "cosine": NAN,
        "mismatch_fraction": NAN, "nan_mismatch": 0, "inf_mismatch": 0,
        "required_atol": NAN, "required_rtol": NAN,
    }
