"""The compiled comparison: every metric of a pair in one pass over its payloads, built in C or with numba.

The numpy path of :mod:`tracediff.compare.metrics` makes some twenty passes over each chunk (the
difference, its maximum, five sums, the float64 moments of ``pcc``, the pass rule, the positions out of
tolerance, the NaN/Inf counts). The compiled pass makes one and reads each element once: a pair that
differs everywhere is then compared at close to the speed of memory. It has two builds of the same
arithmetic: ``fused_pass.c``, built by the machine's C compiler on first use and cached
(:mod:`tracediff.native.fused_c`: it loads in a millisecond), and, where no compiler is found,
``fused.py`` compiled by numba (``pip install 'tracediff[fast]'``; loading it costs about 0.7 s).
``TRACEDIFF_KERNEL=c`` or ``=numba`` takes only that build. The numpy path stays the reference and the
fallback: without either build, for small pairs, for dtypes the kernel does not take, and with
``TRACEDIFF_KERNEL=numpy``.

What is the same, bit for bit, on both paths: ``max_abs_err``, ``max_rel_err``, the NaN, Inf and mismatch
counts, ``mismatch_fraction``, the required tolerances and the positions out of tolerance (each is decided
by the same float64 expression). What differs by rounding only: ``mean_abs_err``, ``rms_err``, ``cosine`` and
``pcc``. The kernel adds the elements of a chunk one after the other in float64 where numpy adds float32
chunks pairwise (``docs/performance.md`` states the bound; ``tests/compare/test_kernel.py`` checks it).

When it runs: where the C build is already cached, from the first pair of at least ``MIN_ELEMENTS``
elements. Otherwise once a process has compared ``START_BYTES`` of payloads with numpy (or :func:`prepare`
was told that many are coming), a background thread builds the C library (a second, in the compiler's own
process) or imports numba and loads its build from numba's cache (compiled on the first run, some seconds,
and cached next to this module or, where that folder is read-only, in numba's user cache folder); pairs go
on to numpy meanwhile, and once it is loaded, every pair of at least ``MIN_ELEMENTS`` elements goes
through it. An alignment told (:func:`expect`) that at least
``REMAINING_BYTES`` are still to come loads it once ``EARLY_BYTES`` of them differed, and waits for it. A
small alignment (``tracediff demo``) never imports numba. The kernel runs without the GIL, so that the
alignment's threads run side by side.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..native import fused_columns as col
from ..order import chunk_size
from ..trace.payload import Payload, as_floats
from .moments import Moments
from .scaled import scaled_sums, sums_are_safe

if TYPE_CHECKING:  # annotations only: nothing here is built at import
    from typing import Protocol, TypeVar

    from .row_pass import PearsonMoments, PositionTracker
    from .scaled import ScaledSum

    class Accumulating(Protocol):
        """The running state of a comparison the kernel adds a pair to (``metrics._Accumulator``)."""

        atol: float
        rtol: float
        pearson: PearsonMoments | None
        tracker: PositionTracker | None
        finite: int
        max_abs: float
        max_rel: float
        sum_abs: ScaledSum
        sum_sq: ScaledSum
        dot: ScaledSum
        norm_a: ScaledSum
        norm_b: ScaledSum
        nan_mismatch: int
        inf_mismatch: int
        mismatched: int

    A = TypeVar("A", bound=Accumulating)

VARIABLE = "TRACEDIFF_KERNEL"  # "numpy": never the compiled kernel; "c", "numba": only that build
# Payload bytes of differing pairs a process compares with numpy before it loads the kernel. Importing numba
# and loading the kernel cost about 1 CPU second (numba imports scipy when it is installed) and 130 MB of
# memory; the kernel saves about 0.5 CPU second per GB of differing pairs (bench/bench_align.py, a port):
# it pays back after some 2 GB, so it is loaded when that many were seen (a sign that more are coming).
START_BYTES = 2 << 30
# An alignment that says how many payload bytes it will compare (expect()) loads the kernel early: once
# EARLY_BYTES of differing pairs were seen with at least REMAINING_BYTES still to come, a sign that a port's
# pair (every tensor differs) is being compared; its comparisons wait for the load (numpy beside it, which
# holds Python's lock, only slowed both). An identical pair, or one where only the last layers differ, never
# loads it.
EARLY_BYTES = 64 << 20
REMAINING_BYTES = 1 << 30
MIN_ELEMENTS = 1 << 15  # a smaller pair costs more to hand over than the kernel saves on it
_TAKEN = frozenset({"float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
                    "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"})


class _State:
    """Whether the kernel is loaded, how many bytes were compared before it was, and the thread loading it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen = 0
        self.expected = 0  # the payload bytes the running alignment will compare, all pairs (expect())
        self.compared = 0  # the payload bytes of every pair compared since, differing or not (counted())
        self.kernel: Callable[..., int] | None = None
        self.loader: threading.Thread | None = None
        self.missing = False  # no build could be loaded: neither a C compiler nor numba
        self.probed = False  # a cached C build was looked for


_state = _State()


def enabled() -> bool:
    """False under ``TRACEDIFF_KERNEL=numpy`` or when neither build can be loaded."""
    return os.environ.get(VARIABLE, "") != "numpy" and not _state.missing


def wanted(a: Payload, b: Payload) -> bool:
    """Whether the pair goes through the kernel: it is loaded, takes both dtypes, and the pair has at least
    ``MIN_ELEMENTS`` elements. Until it is loaded, pairs go to numpy and their bytes are counted; at
    ``START_BYTES`` the kernel starts loading in a thread of its own (:func:`prepare`)."""
    if a.size < MIN_ELEMENTS or a.dtype not in _TAKEN or b.dtype not in _TAKEN or not enabled():
        return False
    if _state.kernel is not None or _probe():
        return True
    with _state.lock:
        _state.seen += a.values.nbytes + b.values.nbytes
        seen, remaining = _state.seen, _state.expected - _state.compared
    if seen >= EARLY_BYTES and remaining >= REMAINING_BYTES:
        # a port's pair: the kernel pays back many times over, and numpy beside its loading (which holds
        # the GIL) would only slow both: wait for it
        prepare(START_BYTES)
        loader = _state.loader
        if loader is not None:
            loader.join()
        return _state.kernel is not None
    prepare(seen)
    return False


def expect(payload_bytes: int) -> None:
    """Say how many payload bytes (both sides, every pair) the comparisons about to run will read: the kernel
    then loads as soon as a port-like workload shows (``EARLY_BYTES``), not after ``START_BYTES``."""
    with _state.lock:
        _state.expected, _state.compared = payload_bytes, 0


def counted(payload_bytes: int) -> None:
    """Count a pair's payload bytes as taken up by the alignment, differing or not (against :func:`expect`'s
    total: identical pairs found from their bytes never reach the comparison)."""
    with _state.lock:
        _state.compared += payload_bytes


def prepare(payload_bytes: int) -> None:
    """Start loading the kernel in the background when ``payload_bytes`` (of a comparison about to run, or
    compared so far) reach ``START_BYTES``: importing numba and loading the compiled code from its cache take
    about a second, which the pairs compared meanwhile with numpy hide; the kernel takes over once loaded."""
    if payload_bytes < START_BYTES or not enabled():
        return
    with _state.lock:
        if _state.loader is not None or _state.kernel is not None:
            return
        # a daemon thread: a process that ends first is not kept waiting for a compilation
        _state.loader = threading.Thread(target=_load_quietly, name="tracediff-kernel-load", daemon=True)
        _state.loader.start()


def _probe() -> bool:
    """Load the C build if it is cached already (a millisecond; never builds): once per process."""
    with _state.lock:
        if _state.probed:
            return _state.kernel is not None
        _state.probed = True
    if os.environ.get(VARIABLE, "") == "numba":
        return False
    from ..native import fused_c

    found = fused_c.cached()
    with _state.lock:
        if found is not None and _state.kernel is None:
            _state.kernel = found
        return _state.kernel is not None


def _load_quietly() -> None:
    """:func:`load` in a background thread: any failure leaves the comparison on numpy, never an exception."""
    try:
        load()
    except Exception:  # a numba that fails to compile is as good as none: numpy compares
        _state.missing = True


def load() -> Callable[..., int] | None:
    """The compiled pass: the C build (built now if not cached), else numba's (imported and both float dtypes
    loaded on first use); None when neither can be had."""
    with _state.lock:
        if _state.kernel is not None or _state.missing:
            return _state.kernel
    found = _built()
    with _state.lock:
        if _state.kernel is None:
            _state.kernel = found
        _state.missing = _state.kernel is None
        return _state.kernel


def _built() -> Callable[..., int] | None:
    """The build ``TRACEDIFF_KERNEL`` allows, C first."""
    choice = os.environ.get(VARIABLE, "")
    if choice != "numba":
        from ..native import fused_c

        found = fused_c.load()
        if found is not None or choice == "c":
            return found
    try:
        from . import fused
    except ImportError:  # numba is the optional extra "fast"
        return None
    for work in (np.float32, np.float64):  # loaded from numba's cache (compiled on the first run), before use
        tiny = np.zeros(1, work)
        fused.fused_pass(tiny, tiny, 0, 1, 1, work is np.float32, 0.0, 0.0, 0.0, 1, 0, np.zeros(1, np.bool_),
                         np.empty((1, col.COLUMNS)))
    return fused.fused_pass


def accumulate(a: Payload, b: Payload, acc: A, chunk: int) -> A:
    """``acc`` (empty) with the pair added, as :func:`tracediff.compare.metrics._accumulate` adds it in chunks
    of ``chunk`` elements."""
    kernel = _state.kernel if _state.kernel is not None else load()
    assert kernel is not None, "accumulate() needs the kernel: call wanted() first"
    work: type[np.floating[Any]] = np.float64 if "float64" in (a.dtype, b.dtype) else np.float32
    fa, fb = a.values.reshape(-1), b.values.reshape(-1)
    step = chunk_size(chunk)  # the numpy path's chunks: what it decides per chunk is decided on the same ones
    block = min(step, chunk_size(col.BLOCK))  # a block stays in the L1 cache while its three loops run
    tracker = acc.tracker
    inner, length, hit = (tracker.inner, tracker.length, tracker.hit) if tracker is not None and tracker.inner \
        else (1, 0, np.zeros(1, np.bool_))
    narrow = work is np.float32
    rows = np.empty((-(-a.size // step), col.COLUMNS))
    args = (step, block, narrow, float(acc.atol), float(acc.rtol))
    if _as_is(fa, a.dtype, work) and _as_is(fb, b.dtype, work):  # no conversion: one call over the whole pair
        kernel(fa, fb, 0, *args, acc.max_rel, inner, length, hit, rows)
    else:  # converted a chunk at a time into work arrays, the numpy path's way
        wide_a, wide_b = np.empty(min(step, a.size), work), np.empty(min(step, a.size), work)
        for k, start in enumerate(range(0, a.size, step)):
            stop = min(start + step, a.size)
            ca = as_floats(fa[start:stop], a.dtype, work, wide_a[:stop - start])
            cb = as_floats(fb[start:stop], b.dtype, work, wide_b[:stop - start])
            kernel(ca, cb, start, *args, float(rows[k - 1, col.MAX_REL]) if k else acc.max_rel, inner,
                   length, hit, rows[k:k + 1])
    _merge(rows, fa, fb, a.dtype, b.dtype, work, step, acc)
    return acc


def _as_is(values: np.ndarray, dtype: str, work: type[np.floating[Any]]) -> bool:
    """True when ``values`` are already ``work`` floats in this machine's byte order."""
    return values.dtype == np.dtype(work) and values.dtype.isnative and dtype in ("float32", "float64")


def _merge(rows: np.ndarray, fa: np.ndarray, fb: np.ndarray, dtype_a: str, dtype_b: str,
           work: type[np.floating[Any]], step: int, acc: Accumulating) -> None:
    """Add the chunks' rows to ``acc``: counts and maxima as they are, sums in chunk order (a float64 chunk
    whose sums left the range is summed again on scaled values, as the numpy path does), moments by Chan."""
    acc.finite += int(rows[:, col.FINITE].sum())
    acc.max_abs = max(acc.max_abs, float(rows[:, col.MAX_ABS].max()))
    acc.max_rel = max(acc.max_rel, float(rows[:, col.MAX_REL].max()))
    acc.nan_mismatch += int(rows[:, col.NAN_MISMATCH].sum())
    acc.inf_mismatch += int(rows[:, col.INF_MISMATCH].sum())
    # the numpy path counts a float32 chunk free of NaN, Inf and overflow by the rule, any other by the excess
    rule = rows[:, col.CLEAN] == 1.0 if work is np.float32 else np.zeros(len(rows), np.bool_)
    failed = np.where(rule, rows[:, col.FAILED_RULE], rows[:, col.FAILED_EXCESS])
    acc.mismatched += int(failed.sum() + rows[:, col.NONFINITE_FAILED].sum())
    totals = (acc.sum_abs, acc.sum_sq, acc.dot, acc.norm_a, acc.norm_b)
    sums = rows[:, col.SUM_ABS:col.NORM_B + 1]
    if work is np.float32:  # float32 values widened to float64 neither under- nor overflow a square
        for total, value in zip(totals, sums.sum(axis=0)):
            total.add(float(value))
    for k, row in enumerate(rows if work is np.float64 else rows[:0]):
        if row[col.FINITE] and not sums_are_safe(
                [float(row[col.SUM_SQ]), float(row[col.NORM_A]), float(row[col.NORM_B])],
                int(row[col.FINITE]), np.dtype(np.float64)):
            start = k * step
            ca = as_floats(fa[start:start + step], dtype_a, np.float64)
            cb = as_floats(fb[start:start + step], dtype_b, np.float64)
            keep = np.isfinite(ca) & np.isfinite(cb)
            with np.errstate(all="ignore"):
                scaled = scaled_sums(ca[keep], cb[keep])
        else:
            scaled = tuple((float(v), 0) for v in sums[k])
        for total, (value, exp) in zip(totals, scaled):
            total.add(value, exp)
    if acc.pearson is not None:
        moments = acc.pearson.moments
        for row in rows:
            if row[col.MOMENT_N]:
                moments = moments.merge(Moments(int(row[col.MOMENT_N]), *(float(v) for v in row[col.MEAN_A:])))
        acc.pearson.moments = moments


__all__ = ["EARLY_BYTES", "MIN_ELEMENTS", "REMAINING_BYTES", "START_BYTES", "VARIABLE", "accumulate",
           "counted", "enabled", "expect", "load", "prepare", "wanted"]
