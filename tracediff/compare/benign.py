"""Differences that are not divergences, settled before a tensor pair is measured.

* **Singleton dimensions.** Shapes that differ only by dimensions of size 1
  (``[T]`` against ``[1, T]``: position ids of two implementations) are
  compared after squeezing them; the row says so.
* **Saturated values.** Where both sides sit at or beyond their own dtype's
  finite extreme with the same sign (an additive attention mask holds
  ``finfo(float32).min`` on one side and ``finfo(bfloat16).min`` on the
  other), or are the same infinity, the values compare equal: both mean
  "masked". Without this one masked row of a bf16 port reports an error of
  1.3e36.
* **Integers and bools** compare exactly (every value, at full 64-bit
  precision: 2**40 against 2**40 + 1 is a divergence), whatever the
  tolerance.
* **Complex numbers** compare on both parts: real and imaginary parts are
  metrics of one real tensor with a trailing dimension of 2.
"""

from __future__ import annotations

import math

import torch

from .shapes import squeezable, squeeze_note

_EXACT_NOTE = "integers compared exactly"


def is_exact_dtype(dtype: torch.dtype) -> bool:
    """Integers and bools: compared value for value, never with a tolerance."""
    return not (dtype.is_floating_point or dtype.is_complex)


def prepare_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Bring a pair to comparable form; returns ``(a, b, notes)`` with one note per thing done.

    Squeezes singleton dimensions when that is all that differs, splits
    complex tensors into (real, imaginary) pairs, and makes saturated
    positions of ``b`` equal to ``a``'s. Integer pairs are left as they are
    (see :func:`exact_mismatches`).
    """
    notes: list[str] = []
    if a.shape != b.shape and squeezable(tuple(a.shape), tuple(b.shape)):
        notes.append(squeeze_note(tuple(a.shape), tuple(b.shape)))
        a, b = a.reshape([d for d in a.shape if d != 1]), b.reshape([d for d in b.shape if d != 1])
    if a.is_complex() or b.is_complex():
        notes.append("complex: compared on real and imaginary parts")
        a, b = _as_real_pairs(a), _as_real_pairs(b)
    if a.is_floating_point() and b.is_floating_point() and a.shape == b.shape:
        b, saturated = _settle_saturated(a, b)
        if saturated:
            notes.append(f"{saturated} saturated values (at their dtype's finite extreme on both sides) "
                         "treated as equal")
    return a, b, notes


def _as_real_pairs(t: torch.Tensor) -> torch.Tensor:
    if not t.is_complex():
        t = t.to(torch.complex128 if t.dtype == torch.float64 else torch.complex64)
    return torch.view_as_real(t.resolve_conj())


def _saturated(t: torch.Tensor, info: torch.finfo) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks of the positions at or beyond the finite minimum and maximum of ``info`` (infinities included)."""
    return t <= info.min, t >= info.max


def _workable(t: torch.Tensor) -> torch.Tensor:
    """float8 has no comparison or reduction kernels on every device: look at it in float32 (exact)."""
    return t.float() if t.element_size() == 1 else t


def _settle_saturated(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``b`` with positions where both sides saturate alike replaced by ``a``'s value, and their count.

    One cheap pass over ``a``'s extremes first: most tensors hold nothing near them.
    """
    if a.numel() == 0:
        return b, 0
    info_a, info_b = torch.finfo(a.dtype), torch.finfo(b.dtype)
    wa = _workable(a)
    flat = wa.detach().reshape(-1)
    low, high = torch.aminmax(flat)
    if math.isnan(float(low)) or math.isnan(float(high)):  # NaN poisons the extremes: look past it (a copy)
        low, high = torch.aminmax(flat.nan_to_num(nan=0.0, posinf=math.inf, neginf=-math.inf))
    if float(low) > info_a.min and float(high) < info_a.max:
        return b, 0
    wb = _workable(b)
    low_a, high_a = _saturated(wa, info_a)
    low_b, high_b = _saturated(wb, info_b)
    same = (low_a & low_b) | (high_a & high_b)
    count = int(same.sum())
    if not count:
        return b, 0
    target = torch.promote_types(wa.dtype, wb.dtype)
    settled = wb.to(target, copy=True)
    settled[same] = wa[same].to(target)
    return settled, count


def exact_mismatches(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many positions of an integer or bool pair differ, compared in 64-bit integers (no rounding)."""
    return int(torch.count_nonzero(a.to(torch.int64) != b.to(torch.int64)))
