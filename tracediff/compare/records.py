"""Comparing one matched tensor pair: from payloads when both exist, else from statistics.

Neither needs torch: payloads are decoded and compared with numpy in
:mod:`tracediff.compare.payloads`, statistics here with plain floats.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from ..format import MOMENT_STAT_KEYS
from ..trace.load import Trace
from ..trace.model import TensorRecord
from .measurement import Measurement, unmeasured
from .rule import passes
from .shapes import squeezable, squeeze_note

_STAT_KEYS = MOMENT_STAT_KEYS  # the statistics compared with a tolerance when a payload is missing
_ALL_STATS = frozenset(_STAT_KEYS)
_COUNT_STATS = frozenset(("nan", "posinf", "neginf"))


def compare_records(
    trace_a: Trace, ra: TensorRecord, trace_b: Trace, rb: TensorRecord, *, atol: float, rtol: float,
    along: int | None = None,
) -> Measurement:
    """The measurement of one tensor pair: from payloads when both have one, else from statistics (pairs
    whose statistics are the same numbers share one, frozen). ``along``: the sequence dimension whose
    positions out of tolerance a payload pair also reports (``compare_payloads``)."""
    shape_a, shape_b = ra.shape, rb.shape
    note = ""
    if shape_a != shape_b and shape_a is not None and shape_b is not None:
        if not squeezable(shape_a, shape_b):
            return unmeasured("shape_mismatch", False, f"shape differs: {list(shape_a)} vs {list(shape_b)}")
        note = squeeze_note(shape_a, shape_b)
    if ra.has_payload and rb.has_payload:
        from .payloads import compare_payloads  # numpy is imported only when payloads are compared

        return compare_payloads(trace_a, ra, trace_b, rb, atol=atol, rtol=rtol, along=along)
    measurement = compare_stats(ra, rb, atol=atol, rtol=rtol)
    return replace(measurement, reason=f"{measurement.reason}; {note}") if note else measurement


def compare_stats(ra: TensorRecord, rb: TensorRecord, *, atol: float, rtol: float) -> Measurement:
    """An approximate verdict from recorded statistics (mean, std, min, max, abs_mean).

    Each statistic of B must lie within ``atol + rtol * |statistic of A|`` of
    A's, plus the rounding of statistics parsed from transformers' strings
    (five significant digits, so ``5e-5 * |value|`` per side); ``max_abs_err``
    and ``max_rel_err`` are the largest differences among the statistics,
    ``required_atol``/``required_rtol`` what would pass beyond that rounding,
    and NaN/Inf counts must agree when both sides recorded them. The other
    metrics are NaN. Pairs whose statistics are the same numbers share one measurement.
    """
    sa, sb = ra.stats, rb.stats
    keys = _STAT_KEYS if _ALL_STATS <= sa.keys() and _ALL_STATS <= sb.keys() else \
        tuple(k for k in _STAT_KEYS if k in sa and k in sb)
    if not keys:
        missing = "A" if not ra.stats else "B"
        return unmeasured("no_data", None, f"no payload and no statistics in {missing}")
    if sa == sb and not (ra.stale_reason or rb.stale_reason):  # the same numbers: nothing differs
        return _identical_stats(keys)
    # written in full by tracediff (with "numel"), or rounded to five digits by transformers: see _rounding
    round_a = 0.0 if "numel" in sa else _REPR_ROUNDING
    round_b = 0.0 if "numel" in sb else _REPR_ROUNDING
    isfinite, inf = math.isfinite, math.inf
    worst_abs, worst_rel, need_atol, need_rtol, failing = 0.0, 0.0, 0.0, 0.0, []
    for key in keys:  # one row per compared tensor: the loop is written for speed, the rules are _rounding's
        va, vb = float(sa[key]), float(sb[key])
        if va == vb:
            continue
        if isfinite(va) and isfinite(vb):
            diff = abs(va - vb)
            excess = diff - round_a * abs(va) - round_b * abs(vb)
        elif math.isnan(va) and math.isnan(vb) or _overflowed(ra, key, va) or _overflowed(rb, key, vb):
            continue
        else:
            diff = abs(va - vb)
            if math.isnan(diff):
                diff = inf
            excess = diff - _rounding(ra, va) - _rounding(rb, vb)
        if not excess > 0.0:
            excess = 0.0
        scale = abs(va)
        if diff > worst_abs:
            worst_abs = diff
        relative = diff / scale if va else inf
        if relative > worst_rel:
            worst_rel = relative
        if excess > need_atol:
            need_atol = excess
        relative = excess / scale if va else (inf if excess else 0.0)
        if relative > need_rtol:
            need_rtol = relative
        if not (isfinite(excess) and passes(excess, scale, atol, rtol)):
            failing.append(f"{key} {va:.6g} vs {vb:.6g}")
    nan_a = nan_b = inf_a = inf_b = 0  # transformers' traces record no counts: nothing to compare
    if _COUNT_STATS <= sa.keys() and _COUNT_STATS <= sb.keys():
        nan_a, nan_b = int(sa["nan"]), int(sb["nan"])
        inf_a, inf_b = int(sa["posinf"]) + int(sa["neginf"]), int(sb["posinf"]) + int(sb["neginf"])
    if nan_a != nan_b:
        failing.append(f"NaN count {nan_a} vs {nan_b}")
    if inf_a != inf_b:
        failing.append(f"Inf count {inf_a} vs {inf_b}")
    reason = "compared on statistics only: " + ", ".join(failing) if failing else _compared_on(keys)
    stale = ra.stale_reason or rb.stale_reason
    if stale:
        reason += f" ({stale})"
    return _stats_fields(not failing, reason, worst_abs, worst_rel, need_atol, need_rtol, abs(nan_a - nan_b),
                         abs(inf_a - inf_b))


@lru_cache(maxsize=64)  # one reason string shared by every row that compared the same statistics
def _compared_on(keys: tuple[str, ...]) -> str:
    return "compared on statistics only: " + ", ".join(keys)


@lru_cache(maxsize=64)  # in a trace aligned with itself or a rerun, most pairs: built once, shared (frozen)
def _identical_stats(keys: tuple[str, ...]) -> Measurement:
    return _stats_fields(True, _compared_on(keys), 0.0, 0.0, 0.0, 0.0, 0, 0)


def _stats_fields(within: bool, reason: str, worst_abs: float, worst_rel: float, need_atol: float,
                  need_rtol: float, nan_mismatch: int, inf_mismatch: int) -> Measurement:
    counts_agree = not (nan_mismatch or inf_mismatch)
    return Measurement(
        "close" if within else "diverged", reason, within, True,  # equal statistics do not prove equal tensors
        max_abs_err=worst_abs, max_rel_err=worst_rel, nan_mismatch=nan_mismatch, inf_mismatch=inf_mismatch,
        required_atol=need_atol if counts_agree else math.inf, required_rtol=need_rtol if counts_agree else math.inf)


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
