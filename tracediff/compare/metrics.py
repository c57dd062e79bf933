"""Error metrics between a reference tensor ``a`` and a candidate ``b``.

Every metric is defined here once, over the positions where both values are
finite (``F``), in float64:

===================  ==========================================================
``max_abs_err``      ``max |a - b|`` over F
``max_rel_err``      ``max |a - b| / |a|`` over F; where ``a == 0`` the ratio
                     is 0 if ``b == 0`` too and ``inf`` otherwise, so it is
                     exactly the smallest rtol that passes with ``atol=0``
``mean_abs_err``     ``mean |a - b|`` over F
``rms_err``          ``sqrt(mean (a - b)^2)`` over F
``cosine``           ``<a, b> / (|a| |b|)`` over F; 1 if both are all zeros
                     (or F is empty), 0 if only one is (a zero vector has no
                     direction: it is neither aligned nor opposed)
``nan_mismatch``     positions where exactly one side is NaN
``inf_mismatch``     positions with an infinity on either side that is not
                     the same infinity on the other (NaN positions excluded)
``mismatch_fraction``  fraction of all positions violating the
                     ``torch.testing.assert_close`` rule
                     ``|a - b| <= atol + rtol * |a|`` (``a`` is the
                     reference); NaN against NaN and an infinity against the
                     same infinity pass, any other non-finite pair fails
``required_atol``    the smallest atol that passes with ``rtol=0``:
                     ``max_abs_err``, or ``inf`` with a non-finite mismatch
``required_rtol``    the smallest rtol that passes with ``atol=0``:
                     ``max_rel_err``, or ``inf`` with a non-finite mismatch
===================  ==========================================================

``compare_tensors`` computes all of them in one streaming pass over chunks of
the flattened inputs (temporaries stay small and in cache, so memory does not
grow with tensor size) after a bitwise-equality fast path. Elementwise work
runs in float32 (float64 when either side is float64) and each chunk's
partial sums are accumulated in float64. It runs on numpy: payloads come as
:class:`tracediff.trace.payload.Payload`; numpy arrays and torch tensors are
accepted too (torch is imported only to convert a tensor).

Sums of squares and dot products are never allowed to leave the float range:
when a chunk's direct sums show that a square under- or overflowed, the chunk
is summed again on values divided by a power of two near their largest
magnitude, as BLAS ``nrm2`` does (:mod:`tracediff.compare.scaled`), and the
totals are carried as ``value * 2**exp``. So a subnormal value against zero
has cosine 0 and an RMS error equal to its magnitude, and values near 1e308
give finite means. Only a difference that itself exceeds the float64 range
(``1e308 - (-1e308)``) is reported as ``inf``. The small functions in
``METRICS`` compute one metric each, directly from the definitions; they are
the reference the streaming kernel is tested against.

With numba installed (``tracediff[fast]``), a large pair of a large alignment
is compared instead by one compiled pass (:mod:`tracediff.compare.kernel`):
the same counts, maxima and positions, the sums within their rounding bound.
The numpy kernel here stays the reference and the fallback.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..order import chunk_size
from ..trace.payload import Payload, as_floats, payload_of
from . import kernel
from .moments import MOMENT_BLOCK
from .row_pass import PearsonMoments, PositionTracker, RowExtras
from .rule import passes
from .scaled import ScaledSum, exponent_of, safe_ldexp, scale_down, scaled_sums, sums_are_safe

CHUNK = 1 << 18  # 1 MiB of float32 per operand: a chunk's temporaries stay in cache (1.4x faster than 2**20 here)
# float32 rounds |a - b| and atol + rtol |a| by well under one part in a million: elements that close to a
# decision are settled again in float64.
_SLACK = 1e-6
_FLOAT32_TINY_STEPS = 2.0 ** -148
_F64 = np.float64


def _quiet() -> np.errstate:
    """numpy warns on the infinities and NaNs a comparison meets by design; the metrics handle them."""
    return np.errstate(all="ignore")


def _smallest_rtol(a: np.ndarray, b: np.ndarray) -> float:
    """The smallest r with ``|a - b| <= r |a|`` for every element in float64 arithmetic (``a != 0``)."""
    keep = a != 0
    d, absa = np.abs(a[keep] - b[keep]), np.abs(a[keep])
    r = float(np.max(d / absa))
    while bool(np.any(d > r * absa)):  # the quotient rounded down: step up one ulp at a time
        r = math.nextafter(r, math.inf)
    return r


@dataclass(frozen=True)
class PairMetrics:
    """Every metric of one tensor pair under one (atol, rtol)."""

    numel: int
    identical: bool
    max_abs_err: float
    max_rel_err: float
    mean_abs_err: float
    rms_err: float
    cosine: float
    nan_mismatch: int
    inf_mismatch: int
    mismatched: int
    mismatch_fraction: float
    required_atol: float
    required_rtol: float

    @property
    def within_tolerance(self) -> bool:
        return self.mismatched == 0

    def to_dict(self) -> dict[str, float | int | bool]:
        return asdict(self)


def bitwise_equal(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` have the same dtype, shape and bytes (NaN payloads included)."""
    a, b = payload_of(a), payload_of(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.size == 0 or bool(np.array_equal(_bits(a.values), _bits(b.values)))


def _bits(values: np.ndarray) -> np.ndarray:
    """The bytes of ``values`` as unsigned integers of their width (one per element: NaN equals its own bits)."""
    return values.view(f"u{values.dtype.itemsize}") if values.dtype.itemsize in (1, 2, 4, 8) \
        else values.view(np.uint8)


def identical_metrics(n: int) -> PairMetrics:
    """The metrics of two identical tensors of ``n`` elements (every error 0, cosine 1)."""
    return PairMetrics(numel=n, identical=True, max_abs_err=0.0, max_rel_err=0.0, mean_abs_err=0.0, rms_err=0.0,
                       cosine=1.0, nan_mismatch=0, inf_mismatch=0, mismatched=0, mismatch_fraction=0.0,
                       required_atol=0.0, required_rtol=0.0)


def compare_tensors(a: Any, b: Any, *, atol: float, rtol: float) -> PairMetrics:
    """All metrics of reference ``a`` against ``b`` (same shape, any real dtypes).

    ``a`` and ``b`` are payloads, numpy arrays or torch tensors. Elementwise
    work runs in the wider of the two dtypes, at least float32, over chunks
    of ``CHUNK`` elements, each converted on its own (a half-precision pair is
    never widened whole); each chunk's partial sums are combined in float64.
    Chunks holding a NaN or an infinity are redone in float64.
    """
    return _measure(a, b, atol, rtol, None, False)[0]


def measure_tensors(a: Any, b: Any, *, atol: float, rtol: float, along: int | None = None
                    ) -> tuple[PairMetrics, RowExtras]:
    """``compare_tensors`` and, in the same pass, the pair's pcc and (``along``: a dimension of the shape)
    the positions along ``along`` holding an element out of tolerance (:mod:`tracediff.compare.row_pass`).

    An identical pair has pcc 1 and no position out of tolerance.
    """
    return _measure(a, b, atol, rtol, along, True)


def _measure(a: Any, b: Any, atol: float, rtol: float, along: int | None, extras: bool
             ) -> tuple[PairMetrics, RowExtras]:
    a, b = payload_of(a), payload_of(b)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    n = a.size
    tracker = PositionTracker(a.shape, along) if extras and along is not None else None
    if _probably_equal(a, b) and bitwise_equal(a, b):
        positions = tracker.result() if tracker is not None else None
        return identical_metrics(n), RowExtras(1.0 if n else math.nan, positions)
    pearson = PearsonMoments() if extras else None
    acc = _accumulate(a, b, _Accumulator(atol, rtol, pearson, tracker))
    found = RowExtras(pearson.pcc() if pearson is not None else None, tracker.result() if tracker is not None else None)
    return acc.result(n), found


def _accumulate(a: Payload, b: Payload, acc: _Accumulator) -> _Accumulator:
    """``acc`` with the pair added, ``CHUNK`` elements at a time, each chunk converted into this thread's work
    arrays (float64 when either side is, else float32); with numba, a large pair in one compiled pass instead
    (:mod:`tracediff.compare.kernel`, the same results up to the rounding of the sums)."""
    if kernel.wanted(a, b):
        return kernel.accumulate(a, b, acc, CHUNK)
    work = np.float64 if "float64" in (a.dtype, b.dtype) else np.float32
    fa, fb = a.values.reshape(-1), b.values.reshape(-1)
    scratch = _scratch(work)
    step = chunk_size(CHUNK)  # TRACEDIFF_REORDER: shorter, odd chunks (tracediff/order.py)
    with _quiet():
        for start in range(0, a.size, step):
            stop = min(start + step, a.size)
            acc.add(as_floats(fa[start:stop], a.dtype, work, scratch.wide_a[:stop - start]),
                    as_floats(fb[start:stop], b.dtype, work, scratch.wide_b[:stop - start]), start)
    return acc


class _Scratch:
    """The work arrays of one chunk, reused for every chunk a thread compares (``CHUNK`` elements each).

    Fresh temporaries cost more than the arithmetic: each is a new mapping whose pages fault in again,
    chunk after chunk (in the kernel's first version, twice the user time in system time).
    """

    def __init__(self, work: type[np.floating[Any]]) -> None:
        self.wide_a, self.wide_b, self.diff, self.absa, self.excess = (np.empty(CHUNK, work) for _ in range(5))
        self.mask, self.mask2 = np.empty(CHUNK, np.bool_), np.empty(CHUNK, np.bool_)
        self.moment_a, self.moment_b = (np.empty(min(CHUNK, MOMENT_BLOCK), _F64) for _ in range(2))  # pcc's copies


_local = threading.local()


def _scratch(work: type[np.floating[Any]]) -> _Scratch:
    """This thread's work arrays for ``work`` (made again if ``CHUNK`` changed)."""
    name = np.dtype(work).name
    found: _Scratch | None = getattr(_local, name, None)
    if found is None or found.diff.size != CHUNK:
        found = _Scratch(work)
        setattr(_local, name, found)
    return found


def _probably_equal(a: Payload, b: Payload) -> bool:
    """A cheap look at the first elements, so that differing pairs skip the full bitwise check."""
    if a.dtype != b.dtype:
        return False
    head = min(a.size, 1024)
    ha, hb = a.values.reshape(-1)[:head], b.values.reshape(-1)[:head]
    if np.array_equal(_bits(ha), _bits(hb)):
        return True
    if ha.dtype.kind in "fc":
        return bool(np.isnan(ha).any())
    return ha.dtype.kind == "u" and a.dtype.startswith(("bfloat", "float")) and bool(  # bf16, float8 bits
        np.isnan(as_floats(ha, a.dtype, np.float32)).any())


class _Accumulator:
    def __init__(self, atol: float, rtol: float, pearson: PearsonMoments | None = None,
                 tracker: PositionTracker | None = None) -> None:
        self.atol, self.rtol = atol, rtol
        self.pearson, self.tracker = pearson, tracker
        self.finite = 0
        self.max_abs = 0.0
        self.max_rel = 0.0
        # sums of |a - b|, (a - b)^2, a.b, a.a, b.b, kept as value * 2**exp (see scaled.py)
        self.sum_abs, self.sum_sq, self.dot, self.norm_a, self.norm_b = (ScaledSum() for _ in range(5))
        self.nan_mismatch = 0
        self.inf_mismatch = 0
        self.mismatched = 0

    def add(self, a: np.ndarray, b: np.ndarray, start: int = 0) -> None:
        """Add the chunk of elements ``start`` to ``start + len(a)``."""
        if not a.size:
            return
        scratch = _scratch(a.dtype.type)
        absdiff = np.abs(np.subtract(a, b, out=scratch.diff[:a.size]), out=scratch.diff[:a.size])
        where = int(np.argmax(absdiff))  # the first NaN, if any: NaN sends the chunk to the float64 path
        worst = float(absdiff[where])
        if math.isfinite(worst):
            self._add_finite(a, b, absdiff, worst, where, start)
            return
        if self.tracker is not None:  # positions of the whole chunk, non-finite elements included
            self.tracker.add_rule(start, a, b, self.atol, self.rtol)
        a, b = a.astype(_F64, copy=False), b.astype(_F64, copy=False)
        both = np.isfinite(a) & np.isfinite(b)
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        self.nan_mismatch += int(np.count_nonzero(nan_a ^ nan_b))
        neither_nan = ~(nan_a | nan_b)
        self.inf_mismatch += int(np.count_nonzero(~both & neither_nan & (a != b)))
        same_nonfinite = (nan_a & nan_b) | (~both & neither_nan & (a == b))
        self.mismatched += int(np.count_nonzero(~both & ~same_nonfinite))
        if bool(both.any()):
            fa, fb = a[both], b[both]
            ad = np.abs(fa - fb)
            where = int(np.argmax(ad))
            self._add_finite(fa, fb, ad, float(ad[where]), where, None)

    def _add_finite(self, a: np.ndarray, b: np.ndarray, absdiff: np.ndarray, worst: float, where: int,
                    start: int | None) -> None:
        """Add finite elements; ``start``: where they begin in the tensor (None: a selection, positions done)."""
        self.finite += a.size
        scratch = _scratch(a.dtype.type)
        sums = [float(np.sum(absdiff)), float(np.dot(absdiff, absdiff)), float(np.dot(a, b)), float(np.dot(a, a)),
                float(np.dot(b, b))]
        if self.pearson is not None:
            self.pearson.add(a, b, scratch.moment_a, scratch.moment_b)
        if sums_are_safe([sums[1], sums[3], sums[4]], a.size, a.dtype):
            scaled = tuple((value, 0) for value in sums)
        else:  # a square under- or overflowed (a zero may be an underflow): redo on scaled float64 values
            scaled = scaled_sums(a, b)
        for total, (value, exp) in zip((self.sum_abs, self.sum_sq, self.dot, self.norm_a, self.norm_b), scaled):
            total.add(value, exp)
        if worst == 0:
            return
        exact = a.dtype == _F64
        if not exact:  # the float32 maximum is within one rounding of the exact one; settle it in float64
            worst = _exact_max(a, b, absdiff, worst, where, scratch.mask[:a.size])
        self.max_abs = max(self.max_abs, worst)
        absa = np.abs(a, out=scratch.absa[:a.size])
        if worst > self.atol:  # otherwise every element passes
            tracker = self.tracker if start is not None else None
            failed = self._count_mismatches(a, b, absa, absdiff, exact, scratch, tracker is not None)
            self.mismatched += failed
            if failed and tracker is not None and start is not None:
                if exact:  # the float64 count subtracts before comparing: the rule itself names the positions
                    tracker.add(start, ~passes(absdiff, absa, self.atol, self.rtol))  # |a - b| and |a|, as held
                else:
                    tracker.add(start, scratch.mask[:a.size])
        if self.max_rel == math.inf:
            return
        if self.max_rel > 0:  # most chunks cannot raise the maximum: one product and one comparison tell
            # float32 rounds |a - b| and |a| by ~6e-8 each: an element whose exact ratio exceeds max_rel is above
            # max_rel (1 - 2 _SLACK) here (a zero |a| with a difference included)
            floor = np.multiply(absa, self.max_rel * (1 - 2 * _SLACK), out=scratch.excess[:a.size])
            if not bool(np.greater(absdiff, floor, out=scratch.mask[:a.size]).any()):
                return
        if float(np.min(absa)) == 0:
            zero = absa == 0
            if bool(np.any(zero & (absdiff > 0))):
                self.max_rel = math.inf
                return
            absa[zero] = 1.0
        rel = np.divide(absdiff, absa, out=absdiff)
        top_at = int(np.argmax(rel))
        top = float(rel[top_at])
        if top == 0:
            return
        near = _near_top(rel, top * (1 - _SLACK), top_at, scratch.mask[:rel.size])
        self.max_rel = max(self.max_rel, _smallest_rtol(a[near].astype(_F64), b[near].astype(_F64)))

    def _count_mismatches(self, a: np.ndarray, b: np.ndarray, absa: np.ndarray, absdiff: np.ndarray,
                          exact: bool, scratch: _Scratch, keep_mask: bool = False) -> int:
        """Elements failing ``|a - b| <= atol + rtol |a|``, decided in float64 arithmetic.

        ``keep_mask``: leave the failing elements marked in ``scratch.mask`` (float32 work only).
        """
        excess = np.multiply(absa, self.rtol, out=scratch.excess[:a.size])
        np.subtract(absdiff, excess, out=excess)  # |a - b| - rtol |a|
        mask = scratch.mask[:a.size]
        if exact:
            return int(np.count_nonzero(np.greater(excess, self.atol, out=mask)))
        # float32 rounds excess by far less than `margin`; elements within it are settled in float64. The floor
        # of two float32 subnormal steps keeps the window open where atol itself rounds to a subnormal.
        margin = _SLACK * (self.atol + self.rtol * float(np.max(absa))) + _FLOAT32_TINY_STEPS
        clear_fail = int(np.count_nonzero(np.greater(excess, self.atol + margin, out=mask)))
        near = scratch.mask2[:a.size] if keep_mask else mask
        close = int(np.count_nonzero(np.greater(excess, self.atol - margin, out=near))) - clear_fail
        if not close:
            return clear_fail
        idx = np.flatnonzero((excess > self.atol - margin) & (excess <= self.atol + margin))
        a64, b64 = a[idx].astype(_F64), b[idx].astype(_F64)
        failed = ~passes(np.abs(a64 - b64), np.abs(a64), self.atol, self.rtol)
        if keep_mask:
            mask[idx[failed]] = True
        return clear_fail + int(np.count_nonzero(failed))

    def result(self, n: int) -> PairMetrics:
        f = self.finite
        nonfinite = self.nan_mismatch + self.inf_mismatch > 0
        # mean <= rms <= max holds exactly; float32 partial sums may round across it, so it is restored.
        # sum_sq's exponent is even (twice a scale's), so the root's is exact.
        mean = min(safe_ldexp(self.sum_abs.value / f, self.sum_abs.exp), self.max_abs) if f else 0.0
        rms = safe_ldexp(math.sqrt(self.sum_sq.value / f), self.sum_sq.exp // 2) if f else 0.0
        rms = min(max(mean, rms), self.max_abs)
        return PairMetrics(
            numel=n, identical=False, max_abs_err=self.max_abs, max_rel_err=self.max_rel,
            mean_abs_err=mean, rms_err=rms, cosine=_cosine_of(self.dot, self.norm_a, self.norm_b),
            nan_mismatch=self.nan_mismatch, inf_mismatch=self.inf_mismatch,
            mismatched=self.mismatched, mismatch_fraction=self.mismatched / n if n else 0.0,
            required_atol=math.inf if nonfinite else self.max_abs,
            required_rtol=math.inf if nonfinite else self.max_rel,
        )


def _cosine_of(dot: ScaledSum, norm_a: ScaledSum, norm_b: ScaledSum) -> float:
    """``<a, b> / (|a| |b|)`` from scaled sums: 1 when both norms are 0, 0 when one is, clamped to [-1, 1]."""
    if norm_a.is_zero or norm_b.is_zero:
        return 1.0 if norm_a.is_zero and norm_b.is_zero else 0.0
    ratio = dot.value / (math.sqrt(norm_a.value) * math.sqrt(norm_b.value))
    return max(-1.0, min(1.0, safe_ldexp(ratio, dot.exp - norm_a.exp // 2 - norm_b.exp // 2)))


def _near_top(values: np.ndarray, floor: float, top_at: int, mask: np.ndarray | None = None) -> np.ndarray:
    """Indices of the elements ``>= floor``; usually only the maximum, found without a scan for indices."""
    above = np.greater_equal(values, floor, out=mask)
    if int(np.count_nonzero(above)) == 1:
        return np.array([top_at])
    return np.flatnonzero(above)


def _exact_max(a: np.ndarray, b: np.ndarray, absdiff: np.ndarray, worst: float, where: int,
               mask: np.ndarray) -> float:
    """``max |a - b|`` in float64. Rounding is monotonic, so the exact maximum is among the float32 maxima."""
    idx = _near_top(absdiff, worst, where, mask)
    return float(np.max(np.abs(a[idx].astype(_F64) - b[idx].astype(_F64))))


# Reference definitions, one metric each (see the module docstring).


def finite_pair(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
    pa, pb = payload_of(a), payload_of(b)
    x, y = as_floats(pa.values, pa.dtype, _F64).reshape(-1), as_floats(pb.values, pb.dtype, _F64).reshape(-1)
    keep = np.isfinite(x) & np.isfinite(y)
    return (x, y) if keep.all() else (x[keep], y[keep])


def max_abs_err(a: Any, b: Any) -> float:
    """``max |a - b|`` over positions where both are finite (0 if none)."""
    fa, fb = finite_pair(a, b)
    with _quiet():
        return float(np.max(np.abs(fa - fb))) if fa.size else 0.0


def max_rel_err(a: Any, b: Any) -> float:
    """``max |a - b| / |a|`` over finite positions; ``a == 0``: 0 if ``b == 0`` else inf."""
    fa, fb = finite_pair(a, b)
    with _quiet():
        d = np.abs(fa - fb)
        if not fa.size:
            return 0.0
        if bool(np.any((fa == 0) & (d > 0))):
            return math.inf
        return float(np.max(d / np.where(fa == 0, 1.0, np.abs(fa))))


def _scaled_abs_diff(a: Any, b: Any) -> tuple[np.ndarray, int]:
    """``|a - b|`` over finite positions divided by a power of two ``2**k`` near its maximum, and ``k``."""
    fa, fb = finite_pair(a, b)
    with _quiet():
        d = np.abs(fa - fb)
    k = exponent_of(float(np.max(d))) if d.size else 0
    return scale_down(d, k), k


def mean_abs_err(a: Any, b: Any) -> float:
    """``mean |a - b|`` over finite positions (0 if none), summed on scaled values so it never overflows."""
    d, k = _scaled_abs_diff(a, b)
    return safe_ldexp(float(np.mean(d)), k) if d.size else 0.0


def rms_err(a: Any, b: Any) -> float:
    """``sqrt(mean (a - b)^2)`` over finite positions (0 if none), on scaled values: no under- or overflow."""
    d, k = _scaled_abs_diff(a, b)
    return safe_ldexp(math.sqrt(float(np.mean(d * d))), k) if d.size else 0.0


def cosine(a: Any, b: Any) -> float:
    """``<a, b> / (|a| |b|)`` over finite positions; 1 if both are zero, 0 if only one is.

    Each side is divided by a power of two near its largest magnitude first (the
    cosine does not change), so values from subnormal to huge neither underflow
    nor overflow.
    """
    fa, fb = finite_pair(a, b)
    if not fa.size:
        return 1.0
    sa = scale_down(fa, exponent_of(float(np.max(np.abs(fa)))))
    sb = scale_down(fb, exponent_of(float(np.max(np.abs(fb)))))
    na, nb = math.sqrt(float(np.dot(sa, sa))), math.sqrt(float(np.dot(sb, sb)))
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return max(-1.0, min(1.0, float(np.dot(sa, sb)) / (na * nb)))


def nan_mismatch(a: Any, b: Any) -> float:
    """Positions where exactly one side is NaN."""
    pa, pb = payload_of(a), payload_of(b)
    x, y = as_floats(pa.values, pa.dtype, _F64).reshape(-1), as_floats(pb.values, pb.dtype, _F64).reshape(-1)
    return float(np.count_nonzero(np.isnan(x) ^ np.isnan(y)))


def mismatch_fraction(a: Any, b: Any, *, atol: float, rtol: float) -> float:
    """Fraction of positions failing ``|a - b| <= atol + rtol |a|`` (NaN~NaN and inf~same inf pass)."""
    pa, pb = payload_of(a), payload_of(b)
    x, y = as_floats(pa.values, pa.dtype, _F64).reshape(-1), as_floats(pb.values, pb.dtype, _F64).reshape(-1)
    if not x.size:
        return 0.0
    with _quiet():
        finite = np.isfinite(x) & np.isfinite(y)
        ok = finite & passes(np.abs(x - y), np.abs(x), atol, rtol)
        ok |= (np.isnan(x) & np.isnan(y)) | (np.isinf(x) & (x == y))
    return float(np.count_nonzero(~ok)) / x.size


METRICS: dict[str, Callable[[Any, Any], float]] = {
    "max_abs_err": max_abs_err,
    "max_rel_err": max_rel_err,
    "mean_abs_err": mean_abs_err,
    "rms_err": rms_err,
    "cosine": cosine,
    "nan_mismatch": nan_mismatch,
}
