"""Per-tensor statistics recorded as JSON numbers.

Capture runs inside every module call, so the statistics take as few passes
over the data as torch allows: ``aminmax`` (one pass), ``sum`` and ``dot(x, x)``
(one each, from which mean and std follow), ``abs().sum()``, and a count of
non-zeros only when the range straddles zero. NaN/Inf are counted only when
min or max is not finite, since both propagate NaN and infinities.

``std`` is the unbiased standard deviation (as ``torch.std``), computed in
float64 from the sums; it loses relative precision when ``|mean| >> std``.
Half-precision and float8 tensors are upcast to float32 first.
"""

from __future__ import annotations

import math
from typing import Any

import torch

FLOAT_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64} | {
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, name)
}

STAT_KEYS = ("numel", "mean", "std", "min", "max", "abs_mean", "nan", "posinf", "neginf", "zeros")


def tensor_stats(tensor: torch.Tensor) -> dict[str, Any]:
    """Statistics of ``tensor`` as plain Python numbers.

    Floating tensors get every key of ``STAT_KEYS``; integer and bool tensors
    get ``numel``, ``min``, ``max`` and ``zeros``; empty tensors get ``numel``
    only. Infinite or NaN results are kept as float ``inf``/``nan``.
    """
    t = tensor.detach()
    n = t.numel()
    if n == 0:
        return {"numel": 0}
    if t.dtype in FLOAT_DTYPES:
        return _float_stats(t, n)
    if t.is_complex():
        return {"numel": n}
    if t.dtype == torch.bool:
        true_count = int(t.sum())
        return {"numel": n, "min": int(true_count == n), "max": int(true_count > 0), "zeros": n - true_count}
    lo, hi = torch.aminmax(t)
    zeros = n - int(torch.count_nonzero(t))
    return {"numel": n, "min": int(lo), "max": int(hi), "zeros": zeros}


def _float_stats(t: torch.Tensor, n: int) -> dict[str, Any]:
    x = t if t.dtype in (torch.float32, torch.float64) else t.float()
    flat = x.reshape(-1)
    lo, hi = torch.aminmax(flat)
    packed = torch.stack([lo, hi, flat.sum(), torch.dot(flat, flat), flat.abs().sum()])
    lo_v, hi_v, total, squares, abs_total = packed.tolist()
    out: dict[str, Any] = {"numel": n, "min": lo_v, "max": hi_v}
    if math.isfinite(lo_v) and math.isfinite(hi_v):
        out.update(nan=0, posinf=0, neginf=0)
        zeros = 0 if (lo_v > 0 or hi_v < 0) else n - int(torch.count_nonzero(flat))
        mean = total / n
        var = (squares - total * total / n) / (n - 1) if n > 1 else math.nan
        out.update(mean=mean, std=math.sqrt(var) if var > 0 else (0.0 if var == var else math.nan))
        out.update(abs_mean=abs_total / n, zeros=zeros)
        return out
    nan = int(torch.isnan(flat).sum())
    posinf = int((flat == math.inf).sum())
    neginf = int((flat == -math.inf).sum())
    finite = flat[torch.isfinite(flat)]
    m = finite.numel()
    out.update(nan=nan, posinf=posinf, neginf=neginf, zeros=n - int(torch.count_nonzero(flat)) - nan)
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
    if value is None:
        return "None"
    v = float(value)
    if math.isnan(v):
        body = "nan"
    elif math.isinf(v):
        body = "inf" if v > 0 else "-inf"
    elif v == 0:
        body = "0."
    else:
        body = f"{v:.4e}"
    if dtype == torch.get_default_dtype() or dtype not in FLOAT_DTYPES:
        return f"tensor({body})"
    return f"tensor({body}, dtype={dtype})"
