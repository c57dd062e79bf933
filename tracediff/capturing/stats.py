"""Per-tensor statistics recorded as JSON numbers.

Capture runs inside every module call, so the statistics of a floating
tensor take six cheap kernels and no allocation: ``aminmax``, ``sum``, the
signs of the elements written into a reused buffer ``s``, then three dot
products, ``x.x`` (sum of squares), ``s.x`` (sum of absolute values) and
``s.s`` (count of non-zeros), all read back in one transfer. Mean and std
follow from the sums; NaN/Inf are counted only when min or max is not
finite, since both propagate NaN and infinities. Large tensors are processed
in chunks of 2**20 elements, which bounds the buffers and keeps the float32
count of non-zeros exact.

``std`` is the unbiased standard deviation (as ``torch.std``), computed in
float64 from the sums; it loses relative precision when ``|mean| >> std``.
Half-precision and float8 tensors are upcast to float32 first, chunk by
chunk, into a reused buffer.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import format as fmt

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

    def get(self, device: torch.device, dtype: torch.dtype, n: int, slot: int = 0) -> torch.Tensor:
        """A 1-D buffer of ``n <= CHUNK`` elements; its contents are undefined."""
        key = (device, dtype, slot)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < n:
            # Full size at once: on CPU, pages never written cost nothing, and no regrowth touches new memory.
            buffer = torch.empty(max(n, CHUNK), dtype=dtype, device=device)
            self._buffers[key] = buffer
        return buffer[:n]


_WIDE_UNSIGNED = {getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)}
_SQUARES_FLOOR = 1e-30


def tensor_stats(tensor: torch.Tensor, *, buffers: StatsBuffers | None = None) -> dict[str, Any]:
    """Statistics of ``tensor`` as plain Python numbers.

    Floating tensors get every key of ``STAT_KEYS``; integer and bool tensors
    get ``numel``, ``min``, ``max`` and ``zeros``; empty tensors get ``numel``
    only. Infinite or NaN results are kept as float ``inf``/``nan``. Pass the
    same ``buffers`` to successive calls to avoid allocating work memory.
    """
    t = tensor.detach()
    n = t.numel()
    if n == 0:
        return {"numel": 0}
    if t.dtype in FLOAT_DTYPES:
        return _float_stats(t, n, buffers if buffers is not None else StatsBuffers())
    if t.is_complex():
        return {"numel": n}
    if t.dtype == torch.bool:
        true_count = int(t.sum())
        return {"numel": n, "min": int(true_count == n), "max": int(true_count > 0), "zeros": n - true_count}
    if t.dtype in _WIDE_UNSIGNED:  # torch has no CPU min/max for these; numpy's are exact
        values = t.cpu().contiguous().numpy()
        return {"numel": n, "min": int(values.min()), "max": int(values.max()), "zeros": int((values == 0).sum())}
    lo, hi = torch.aminmax(t)
    zeros = n - int(torch.count_nonzero(t))
    return {"numel": n, "min": int(lo), "max": int(hi), "zeros": zeros}


def _float_stats(t: torch.Tensor, n: int, buffers: StatsBuffers) -> dict[str, Any]:
    flat = t.reshape(-1)
    parts: list[torch.Tensor] = []
    for start in range(0, n, CHUNK):
        x = flat if n <= CHUNK else flat[start:start + CHUNK]
        m = x.numel()
        if x.dtype not in _NATIVE:
            x = buffers.get(x.device, torch.float32, m, slot=1).copy_(x)
        signs = torch.sign(x, out=buffers.get(x.device, x.dtype, m))
        lo, hi = torch.aminmax(x)
        parts += (lo, hi, x.sum(), torch.dot(x, x), torch.dot(signs, x), torch.dot(signs, signs))
    values = torch.stack(parts).tolist()
    lows, highs = values[0::6], values[1::6]
    if all(math.isfinite(v) for v in lows + highs):
        total, squares, abs_total = math.fsum(values[2::6]), math.fsum(values[3::6]), math.fsum(values[4::6])
        zeros = n - round(math.fsum(values[5::6]))
        largest = max(abs(min(lows)), abs(max(highs)))
        if not math.isfinite(total + squares + abs_total) or (largest and squares < _SQUARES_FLOOR):
            # float32 squares overflow above ~1.8e19 and underflow below ~1e-19 (and sums of values near
            # float32's max overflow too): redo the sums in float64.
            total, squares, abs_total = _float64_sums(flat)
        mean = total / n
        var = (squares - total * total / n) / (n - 1) if n > 1 else math.nan
        return {
            "numel": n, "min": min(lows), "max": max(highs), "nan": 0, "posinf": 0, "neginf": 0,
            "mean": mean, "std": math.sqrt(var) if var > 0 else (0.0 if var == var else math.nan),
            "abs_mean": abs_total / n, "zeros": zeros,
        }
    return _non_finite_stats(flat if flat.dtype in _NATIVE else flat.float(), n)


def _float64_sums(flat: torch.Tensor) -> tuple[float, float, float]:
    """Sum, sum of squares and sum of absolute values, accumulated in float64 (rarely needed, so not fast)."""
    total = squares = abs_total = 0.0
    for start in range(0, flat.numel(), CHUNK):
        x = flat[start:start + CHUNK].double()
        total += float(x.sum())
        squares += float(torch.dot(x, x))
        abs_total += float(x.abs().sum())
    return total, squares, abs_total


def _non_finite_stats(flat: torch.Tensor, n: int) -> dict[str, Any]:
    nan = int(torch.isnan(flat).sum())
    posinf = int((flat == math.inf).sum())
    neginf = int((flat == -math.inf).sum())
    finite = flat[torch.isfinite(flat)]
    m = finite.numel()
    out: dict[str, Any] = {"numel": n, "nan": nan, "posinf": posinf, "neginf": neginf,
                           "zeros": n - int(torch.count_nonzero(flat))}  # NaN is not zero
    # Moments over all elements would be NaN; report them over the finite ones.
    if m:
        f64 = finite.double()
        out.update(mean=float(f64.mean()), std=float(f64.std()) if m > 1 else math.nan)
        out.update(abs_mean=float(f64.abs().mean()))
        lo_f, hi_f = torch.aminmax(finite)
        out.update(min=float(lo_f) if not neginf else -math.inf, max=float(hi_f) if not posinf else math.inf)
    else:
        out.update(mean=math.nan, std=math.nan, abs_mean=math.nan)
        out.update(min=-math.inf if neginf else math.nan, max=math.inf if posinf else math.nan)
    return out


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
