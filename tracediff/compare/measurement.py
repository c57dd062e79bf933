"""What comparing one tensor pair found: a frozen :class:`Measurement`, built by the statistics path
(:mod:`tracediff.compare.records`), the payload path (:mod:`tracediff.compare.payloads`) and the layout
search, and read by the row builder. Neither path imports the other.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ..trace.model import TensorRecord

if TYPE_CHECKING:
    from .metrics import PairMetrics
    from .positions import PositionErrors

NAN = math.nan


@dataclass(frozen=True, slots=True)
class Measurement(Mapping[str, Any]):
    """One tensor pair measured: its status, why, and every metric (NaN where it was not measured).

    ``status`` is ``identical``, ``close``, ``diverged``, ``shape_mismatch``,
    ``unreadable`` or ``no_data``; ``within_tolerance`` is None when nothing
    could be compared. ``approximate`` is True when the metrics come from
    recorded statistics, not payloads (only ``max_abs_err``, ``max_rel_err``,
    the NaN/Inf mismatches and the required tolerances are then measured).
    Equal measurements may be one shared object: it is frozen. ``pcc`` and
    ``positions`` are what the payload pass found for the row's annotations
    (:mod:`tracediff.compare.row_pass`), None when it found nothing to say.

    It is also a read-only ``Mapping`` of its fields (``m["max_abs_err"]``,
    ``m.keys()``), as the result of ``compare_stats`` and ``compare_records`` was in
    tracediff 0.2; read attributes in new code.
    """

    status: str
    reason: str
    within_tolerance: bool | None
    approximate: bool = False
    max_abs_err: float = NAN
    max_rel_err: float = NAN
    mean_abs_err: float = NAN
    rms_err: float = NAN
    cosine: float = NAN
    mismatch_fraction: float = NAN
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    required_atol: float = NAN
    required_rtol: float = NAN
    # found in the same pass, for the row's annotations (tracediff.compare.row_pass); not part of the mapping.
    # None: not measured in the pass (statistics, a layout transform, integers), or the pass could not vouch.
    pcc: float | None = None
    positions: PositionErrors | None = None

    def __getitem__(self, key: str) -> Any:
        if key not in _FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_NAMES)

    def __len__(self) -> int:
        return len(_NAMES)


ANNOTATIONS = ("pcc", "positions")
"""The fields a payload pass finds for the row's annotations, beside the metrics (not part of the mapping)."""
_NAMES = tuple(f.name for f in fields(Measurement) if f.name not in ANNOTATIONS)
_FIELDS = frozenset(_NAMES)


def dtype_note(ra: TensorRecord, rb: TensorRecord) -> str:
    return f"dtype differs: {ra.dtype} vs {rb.dtype} (compared in float64)" if ra.dtype != rb.dtype else ""


def measured(m: PairMetrics, *, approximate: bool, note: str = "") -> Measurement:
    """The measurement of a pair whose values were compared (``PairMetrics``), with ``note`` added to the reason."""
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
    return Measurement(status, reason, m.within_tolerance, approximate, m.max_abs_err, m.max_rel_err,
                       m.mean_abs_err, m.rms_err, m.cosine, m.mismatch_fraction, m.nan_mismatch, m.inf_mismatch,
                       m.required_atol, m.required_rtol)


def unmeasured(status: str, within: bool | None, reason: str) -> Measurement:
    """A pair that could not be measured (``shape_mismatch``, ``unreadable``, ``no_data``): its verdict only."""
    return Measurement(status, reason, within)
