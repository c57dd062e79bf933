"""Per-tensor statistics recorded as JSON numbers: the one implementation.

Every statistic tracediff records is computed here, whoever asks: the capture
on the host (``tensor_stats``), the capture on an accelerator
(:mod:`tracediff.capturing.device_stats` queues the same per-chunk kernels and
reads them back later) and the training-run statistics of
:mod:`tracediff.steps.tensor_stats`. A tensor is reduced chunk by chunk to a
few *partials*, and ``float_summary`` / ``integer_summary`` turn the partials
of all chunks into the recorded keys, so the formulas are written once.

Capture runs inside every module call, so a finite host tensor takes six
cheap kernels and no allocation (``fast_partials``): ``aminmax``, ``sum``, the
signs of the elements written into a reused buffer ``s``, then three dot
products, ``x.x`` (sum of squares), ``s.x`` (sum of absolute values) and
``s.s`` (count of non-zeros). A tensor of one chunk (every tensor of a decode
step) has its six numbers read as they are; several chunks are stacked and
read back in one transfer. Mean and std follow from the sums. NaN and
infinities propagate into min or max, so only then (or when float32 sums
overflow or underflow) is the tensor measured again
by ``wide_partials``: a float64 copy of each chunk, its counts of finite, NaN
and +Inf elements, the finite minimum and maximum, and the same sums with every
non-finite element set to 0. Large tensors are processed in chunks of ``CHUNK``
elements, which bounds the buffers and keeps the float32 count of non-zeros
exact.

``std`` is the unbiased standard deviation (as ``torch.std``), computed in
float64 from the sums; it loses relative precision when ``|mean| >> std``.
Moments of a tensor with NaN or infinities are taken over its finite elements.
Half-precision and float8 tensors are upcast to float32 first, chunk by chunk,
into a reused buffer.

``numpy_stats`` computes the same keys from a host tensor's values in float64
(``float_summary`` and ``integer_summary`` give the keys), in one pass of the
C build of ``tracediff/native/fused_pass.c`` where a C compiler exists, else
with numpy: every runtime but torch (MLX, llama.cpp, the exported graphs)
measures with it, so that torch's intra-op threads never wake up next to the
runtime's own.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from typing import Any

import torch

from .. import format as fmt
from ..native.fused_columns import STATS_COLUMNS
from ..order import chunk_size

FLOAT_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64} | {
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, name)
}

STAT_KEYS = fmt.STAT_KEYS  # the keys of ``tensor_stats`` for a floating tensor, named by the trace format

# Elements per pass over the work buffers: bounds their size, and keeps every
# partial count of non-zeros below 2**24, where float32 counts exactly.
CHUNK = 1 << 20
_NATIVE = (torch.float32, torch.float64)


class StatsBuffers:
    """Work buffers reused across ``tensor_stats`` calls, at most ``CHUNK`` elements each.

    One capture keeps one instance, so that computing statistics allocates
    nothing after the first tensors; memory held is bounded by two buffers
    per (device, dtype) seen, whatever the number of tensors.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.device, torch.dtype, int], torch.Tensor] = {}
        # The views handed out, by size: a decode step asks for the same few sizes over and over, and slicing
        # costs more than the kernel that fills a small view.
        self._views: dict[tuple[torch.device, torch.dtype, int, int], torch.Tensor] = {}

    def get(self, device: torch.device, dtype: torch.dtype, n: int, slot: int = 0) -> torch.Tensor:
        """A 1-D buffer of ``n <= CHUNK`` elements; its contents are undefined."""
        view = self._views.get((device, dtype, slot, n))
        if view is not None:
            return view
        key = (device, dtype, slot)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < n:
            # Full size at once: on CPU, pages never written cost nothing, and no regrowth touches new memory.
            buffer = torch.empty(max(n, CHUNK), dtype=dtype, device=device)
            self._buffers[key] = buffer
            self._views = {k: v for k, v in self._views.items() if k[:3] != key}  # views of the old buffer
        if len(self._views) >= _MAX_VIEWS:
            self._views.clear()
        view = self._views[(device, dtype, slot, n)] = buffer[:n]
        return view


_MAX_VIEWS = 1024  # views kept by ``StatsBuffers``: a few per distinct tensor size


# Unsigned dtypes torch has no min/max kernels for on some devices.
WIDE_UNSIGNED = {getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)}
_SQUARES_FLOOR = 1e-30


def tensor_stats(tensor: torch.Tensor, *, buffers: StatsBuffers | None = None) -> dict[str, Any]:
    """Statistics of ``tensor`` as plain Python numbers.

    Floating tensors get every key of ``STAT_KEYS``; integer and bool tensors
    get ``numel``, ``min``, ``max`` and ``zeros``; empty and complex tensors get
    ``numel`` only. Infinite or NaN results are kept as float ``inf``/``nan``.
    Pass the same ``buffers`` to successive calls to avoid allocating work memory.
    """
    t = tensor.detach()
    n = t.numel()
    if n == 0 or t.is_complex():
        return {"numel": n}
    work = buffers if buffers is not None else StatsBuffers()
    if t.dtype in FLOAT_DTYPES:
        return _float_stats(t.reshape(-1), n, work)
    if t.dtype in WIDE_UNSIGNED:  # torch has no CPU min/max for these; numpy's are exact
        values = t.cpu().contiguous().numpy()
        return {"numel": n, "min": int(values.min()), "max": int(values.max()), "zeros": int((values == 0).sum())}
    kind = "bool" if t.dtype == torch.bool else "int"
    return integer_summary(n, kind, [integer_partials(t.reshape(-1)).tolist()])


def numpy_stats(tensor: torch.Tensor, *, buffers: StatsBuffers | None = None) -> dict[str, Any]:
    """``tensor_stats`` of a CPU tensor, computed in float64 (bfloat16 decoded from its bits): in one pass of
    the compiled statistics (:func:`_compiled_stats`) where they load, else with numpy.

    Same keys as ``tensor_stats``; the sums are float64 throughout, so they can differ from
    ``tensor_stats``' float32 sums in the last bits (and the two float64 paths from each other, in the
    order of their additions). A dtype numpy cannot hold goes to ``tensor_stats``.
    ``buffers`` is accepted for the same signature and unused.
    """
    import numpy as np

    t = tensor.detach()
    n = t.numel()
    if n == 0 or t.is_complex():
        return {"numel": n}
    if t.device.type != "cpu":
        return tensor_stats(t, buffers=buffers)
    if t.dtype == torch.bfloat16:
        from ..files.host import host_array
        from ..trace.payload import as_floats

        values = as_floats(host_array(t).reshape(-1), "bfloat16", np.float32)
    else:
        try:
            values = t.contiguous().numpy().reshape(-1)
        except (TypeError, RuntimeError):  # float8 and other dtypes numpy has no type for
            return tensor_stats(t, buffers=buffers)
    if values.dtype == np.bool_:
        return integer_summary(n, "bool", [[int(np.count_nonzero(values))]])
    if values.dtype.kind in "iu":
        return integer_summary(n, "int", [[int(values.min()), int(values.max()), int(np.count_nonzero(values))]])
    step = chunk_size(CHUNK)  # TRACEDIFF_REORDER: shorter, odd chunks (tracediff/order.py)
    compiled = _compiled_stats()
    if compiled is not None:
        wide = values if values.dtype in (np.float32, np.float64) else values.astype(np.float32)  # float16: exact
        return float_summary(n, compiled.stats(np.ascontiguousarray(wide), step).tolist())
    chunks: list[tuple[float, ...]] = []
    for start in range(0, n, step):
        x = values[start:start + step].astype(np.float64)
        finite = np.isfinite(x)
        if finite.all():
            counts = (x.size, 0, 0)
        else:
            counts = (int(finite.sum()), int(np.isnan(x).sum()), int(np.isposinf(x).sum()))
            x = x[finite]
        lo, hi = (float(x.min()), float(x.max())) if x.size else (math.inf, -math.inf)
        # einsum, not ``x @ x``: BLAS's threads spin after a call and take the cores from MLX's forward
        squares = float(np.einsum("i,i->", x, x))
        chunks.append((lo, hi, float(x.sum()), squares, float(np.abs(x).sum()), int(np.count_nonzero(x)), *counts))
    return float_summary(n, chunks)


_COMPILED: list[Any] = []  # the C build's statistics, or None: looked up (and built if need be) once a process
_COMPILED_LOCK = threading.Lock()


def _compiled_stats() -> Any:
    """The statistics of ``fused_pass.c`` (one pass, float64 sums, the layout of ``wide_partials``), built on
    the first call where no build is cached (a second, once per machine); None without a C compiler and
    under ``TRACEDIFF_KERNEL=numpy`` or ``=numba`` (the comparison kernel's switch: numba has no statistics)."""
    if os.environ.get("TRACEDIFF_KERNEL", "") in ("numpy", "numba"):
        return None
    if not _COMPILED:
        with _COMPILED_LOCK:
            if not _COMPILED:
                from ..native import fused_c

                _COMPILED.append(fused_c.load())
    return _COMPILED[0]


def wide_stats(tensor: torch.Tensor, *, buffers: StatsBuffers | None = None) -> dict[str, Any]:
    """The floating statistics of any real tensor, summed in float64 (integers and bools as numbers).

    The keys of ``STAT_KEYS``; an empty tensor gets ``numel`` only.
    """
    flat = tensor.detach().reshape(-1)
    n = flat.numel()
    if n == 0:
        return {"numel": 0}
    work = buffers if buffers is not None else StatsBuffers()
    step = chunk_size(CHUNK)
    parts = torch.cat([wide_partials(flat[start:start + step], work) for start in range(0, n, step)])
    values = parts.tolist()
    return float_summary(n, [values[k:k + WIDE_PARTS] for k in range(0, len(values), WIDE_PARTS)])


def _float_stats(flat: torch.Tensor, n: int, buffers: StatsBuffers) -> dict[str, Any]:
    lows: Sequence[float]
    highs: Sequence[float]
    step = chunk_size(CHUNK)  # TRACEDIFF_REORDER: shorter, odd chunks (tracediff/order.py)
    if n <= step:  # one chunk (every tensor of a decode step): its six numbers read as they are
        lo, hi, total, squares, abs_total, nonzero = (part.item() for part in _fast_partial_scalars(flat, buffers))
        lows, highs = (lo,), (hi,)
        # each sum of one term as math.fsum gives it: the term itself, -0.0 turned into 0.0
        total, squares, abs_total = total + 0.0, squares + 0.0, abs_total + 0.0
    else:
        values = torch.cat([fast_partials(flat[start:start + step], buffers) for start in range(0, n, step)]).tolist()
        lows, highs = values[0::6], values[1::6]
        total, squares, abs_total = math.fsum(values[2::6]), math.fsum(values[3::6]), math.fsum(values[4::6])
        nonzero = math.fsum(values[5::6])
    if not all(math.isfinite(v) for v in (*lows, *highs)):
        return wide_stats(flat, buffers=buffers)
    lo, hi = min(lows), max(highs)
    if not math.isfinite(total + squares + abs_total) or (max(abs(lo), abs(hi)) and squares < _SQUARES_FLOOR):
        # float32 squares overflow above ~1.8e19 and underflow below ~1e-19 (and sums of values near
        # float32's max overflow too): measure again in float64.
        return wide_stats(flat, buffers=buffers)
    return _summary(n, lo, hi, total, squares, abs_total, round(nonzero), n, 0, 0)


def fast_partials(x: torch.Tensor, buffers: StatsBuffers) -> torch.Tensor:
    """``(min, max, sum, x.x, |x| sum, non-zeros)`` of one chunk, in its own precision (float32 at least).

    Valid only when min and max come out finite; otherwise use ``wide_partials``.
    """
    return torch.stack(_fast_partial_scalars(x, buffers))


def _fast_partial_scalars(x: torch.Tensor, buffers: StatsBuffers) -> tuple[torch.Tensor, ...]:
    """The six 0-d tensors of ``fast_partials``: stacked for several chunks, read one by one for one."""
    m = x.numel()
    if x.dtype not in _NATIVE:
        x = buffers.get(x.device, torch.float32, m, slot=1).copy_(x)
    signs = torch.sign(x, out=buffers.get(x.device, x.dtype, m))
    lo, hi = torch.aminmax(x)
    return lo, hi, x.sum(), torch.dot(x, x), torch.dot(signs, x), torch.dot(signs, signs)


WIDE_PARTS = STATS_COLUMNS  # the length of ``wide_partials``' result: a row of the compiled statistics


def wide_partials(x: torch.Tensor, buffers: StatsBuffers) -> torch.Tensor:
    """``(finite min, finite max, sum, x.x, |x| sum, non-zeros, finite, nan, +inf)`` of one chunk, in float64.

    The sums and non-zeros are over the finite elements. No branch depends on the data, so on an
    accelerator the kernels are only queued: nothing waits until the result is read.
    """
    m = x.numel()
    y = buffers.get(x.device, torch.float64, m, slot=2).copy_(x)
    finite = torch.isfinite(y)
    counts = torch.stack((finite.sum(), torch.isnan(y).sum(), torch.isposinf(y).sum()))
    lo = torch.where(finite, y, math.inf).amin()
    hi = torch.where(finite, y, -math.inf).amax()
    y.nan_to_num_(0.0, 0.0, 0.0)
    signs = torch.sign(y, out=buffers.get(x.device, torch.float64, m, slot=3))
    sums = torch.stack((lo, hi, y.sum(), torch.dot(y, y), torch.dot(signs, y), torch.dot(signs, signs)))
    return torch.cat((sums, counts.double()))


def float_summary(n: int, chunks: Sequence[Sequence[float]]) -> dict[str, Any]:
    """The floating statistics of ``n`` elements from the ``wide_partials`` layout of each chunk."""
    total, squares, abs_total = (math.fsum(c[k] for c in chunks) for k in (2, 3, 4))
    nonzero, finite, nan, posinf = (round(math.fsum(c[k] for c in chunks)) for k in (5, 6, 7, 8))
    return _summary(n, min(c[0] for c in chunks), max(c[1] for c in chunks), total, squares, abs_total, nonzero,
                    finite, nan, posinf)


def _summary(n: int, lo: float, hi: float, total: float, squares: float, abs_total: float, nonzero: int,
             finite: int, nan: int, posinf: int) -> dict[str, Any]:
    """The recorded keys from the sums over the ``finite`` elements and the counts: every formula, once."""
    neginf = n - finite - nan - posinf
    mean = total / finite if finite else math.nan
    var = (squares - total * total / finite) / (finite - 1) if finite > 1 else math.nan
    std = math.sqrt(var) if var > 0 else (0.0 if var == var else math.nan)
    abs_mean = abs_total / finite if finite else math.nan
    zeros = finite - nonzero
    if finite == n:  # the key order of the standard trace's finite tensors
        return {"numel": n, "min": lo, "max": hi, "nan": 0, "posinf": 0, "neginf": 0, "mean": mean, "std": std,
                "abs_mean": abs_mean, "zeros": zeros}
    # The smallest and largest non-NaN elements: NaN only when every element is NaN.
    low = -math.inf if neginf else lo if finite else math.inf if posinf else math.nan
    high = math.inf if posinf else hi if finite else -math.inf if neginf else math.nan
    return {"numel": n, "nan": nan, "posinf": posinf, "neginf": neginf, "zeros": zeros, "mean": mean, "std": std,
            "abs_mean": abs_mean, "min": low, "max": high}


def integer_partials(x: torch.Tensor) -> torch.Tensor:
    """The partials of one chunk of an integer tensor ``(min, max, non-zeros)``, or of a bool one ``(trues,)``."""
    if x.dtype == torch.bool:
        return x.sum().reshape(1)
    lo, hi = torch.aminmax(x)
    return torch.stack((lo.long(), hi.long(), torch.count_nonzero(x)))


def integer_summary(n: int, kind: str, chunks: Sequence[Sequence[float | int]]) -> dict[str, Any]:
    """``numel``, ``min``, ``max`` and ``zeros`` of ``n`` elements from ``integer_partials`` of each chunk."""
    if kind == "bool":
        true_count = int(sum(c[0] for c in chunks))
        return {"numel": n, "min": int(true_count == n), "max": int(true_count > 0), "zeros": n - true_count}
    return {"numel": n, "min": int(min(c[0] for c in chunks)), "max": int(max(c[1] for c in chunks)),
            "zeros": n - int(sum(c[2] for c in chunks))}


def fill_entry_stats(entry: dict[str, Any], stats: dict[str, Any], result: dict[str, Any],
                     dtype: torch.dtype) -> None:
    """Complete an entry whose statistics were measured after it was made (on a device, on a writer thread)."""
    stats.clear()
    stats.update(result)
    if dtype in FLOAT_DTYPES and result.get("numel"):
        entry.update(string_fields(result, dtype))  # the placeholders keep their place in the entry


def placeholder_strings(tensor: torch.Tensor) -> dict[str, str] | None:
    """The string fields an entry will get once measured, as empty strings that hold their place."""
    if tensor.dtype in FLOAT_DTYPES and tensor.numel():
        return {key: "" for key in fmt.STRING_STAT_KEYS}
    return None


def format_scalar(value: float | int | None, dtype: torch.dtype) -> str:
    """A statistic in the form of transformers' string fields, e.g. ``tensor(1.2300e-03)``.

    The standard trace stores ``repr()`` of a 0-d tensor under ``sci_mode``; we
    format the float64 statistic the same way instead of building a tensor.
    """
    return "None" if value is None else _scalar_body(value) + _dtype_suffix(dtype)


def string_fields(stats: dict[str, Any], dtype: torch.dtype) -> dict[str, str]:
    """``mean``, ``std``, ``min`` and ``max`` of ``stats`` as ``format_scalar`` writes them."""
    suffix = _dtype_suffix(dtype)
    fields = {}
    for key in fmt.STRING_STAT_KEYS:
        value = stats.get(key)
        fields[key] = "None" if value is None else _scalar_body(value) + suffix
    return fields


def _dtype_suffix(dtype: torch.dtype) -> str:
    if dtype == torch.get_default_dtype() or dtype not in FLOAT_DTYPES:
        return ")"
    return f", dtype={dtype})"


def _scalar_body(value: float | int) -> str:
    v = float(value)
    if v and v - v == 0:  # finite and non-zero: the common case first
        return f"tensor({v:.4e}"
    if math.isnan(v):
        return "tensor(nan"
    if math.isinf(v):
        return "tensor(inf" if v > 0 else "tensor(-inf"
    if v == 0:
        return "tensor(-0." if math.copysign(1.0, v) < 0 else "tensor(0."
    return f"tensor({v:.4e}"
