"""Differences that are not divergences, settled before a tensor pair is measured.

* **Singleton dimensions.** Shapes that differ only by dimensions of size 1
  (``[T]`` against ``[1, T]``: position ids of two implementations) are
  compared after squeezing them; the row says so.
* **Saturated values.** Where both sides sit at or beyond their own dtype's
  finite extreme with the same sign (an additive attention mask holds
  ``finfo(float32).min`` on one side and ``finfo(bfloat16).min`` on the
  other), or are the same infinity, the values compare equal: both mean
  "masked". Without this one masked row of a bf16 port reports an error of
  1.3e36. A value at one side's extreme against one at most ``-5e3`` on the
  other is masked on both sides too: an older port's additive mask (``-1e4``),
  or attention scores with that mask added (``score - 1e4``, a score of any
  magnitude below 5e3), whose softmax is 0 there on both sides.
* **Integers and bools** compare exactly (every value, at full 64-bit
  precision: 2**40 against 2**40 + 1 is a divergence), whatever the
  tolerance.
* **Complex numbers** compare on both parts: real and imaginary parts are
  metrics of one real tensor with a trailing dimension of 2.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ..trace.payload import Payload, as_floats, finite_max, is_complex, is_floating, payload_of
from .masks import MASKED_AT
from .shapes import squeezable, squeeze_note

#: against the other side's extreme, a value at most this is masked: an additive mask of at most ``-1e4`` plus
#: a score below 5e3 in magnitude (``exp`` of it is 0 in every float dtype)
MASKED_SCORE_AT = MASKED_AT / 2

_EXACT_NOTE = "integers compared exactly"
_CHUNK = 1 << 20


def is_exact_dtype(dtype: str) -> bool:
    """Integers and bools: compared value for value, never with a tolerance."""
    return not (is_floating(dtype) or is_complex(dtype))


class PreparedPair(NamedTuple):
    """A pair in comparable form, one note per thing done, and how many positions are masked in A only and in
    B only (``masked_one_side``: counted by the caller, never measured)."""

    a: Payload
    b: Payload
    notes: list[str]
    masked_one_side: tuple[int, int] = (0, 0)


def prepare_pair(a: Any, b: Any, *, recorded_a: tuple[Any, Any] | None = None, one_side: bool = False
                 ) -> PreparedPair:
    """Bring a pair to comparable form, with one note per thing done.

    Squeezes singleton dimensions when that is all that differs, splits
    complex tensors into (real, imaginary) pairs, and makes saturated
    positions of ``b`` equal to ``a``'s. Integer pairs are left as they are
    (see :func:`exact_mismatches`). Takes payloads, numpy arrays or torch tensors.

    ``recorded_a``: ``a``'s recorded (min, max), written with the payload; when both are finite numbers
    below half its dtype's largest value, nothing can saturate and ``a`` is not scanned for its extremes.
    ``one_side``: also settle the positions masked on one side only (see :func:`settle_scores`).
    """
    a, b = payload_of(a), payload_of(b)
    notes: list[str] = []
    if a.shape != b.shape and squeezable(a.shape, b.shape):
        notes.append(squeeze_note(a.shape, b.shape))
        a = a.with_values(a.values.reshape([d for d in a.shape if d != 1]))
        b = b.with_values(b.values.reshape([d for d in b.shape if d != 1]))
    if is_complex(a.dtype) or is_complex(b.dtype):
        notes.append("complex: compared on real and imaginary parts")
        a, b = _as_real_pairs(a), _as_real_pairs(b)
    if not (is_floating(a.dtype) and is_floating(b.dtype) and a.shape == b.shape):
        return PreparedPair(a, b, notes)
    b, settled = settle_scores(a, b, recorded_a, one_side=one_side)
    if settled.saturated:
        notes.append(saturated_note(settled.saturated))
    if settled.masked:
        notes.append(f"{settled.masked} masked values (at one side's finite extreme, at most -5e3 on the other) "
                     "treated as equal")
    if settled.only_a or settled.only_b:
        notes.append(f"mask difference: {settled.only_a} position(s) masked in A only, {settled.only_b} in B only "
                     "(at the dtype's extreme on one side, a plain value on the other); the other positions "
                     "compared")
    return PreparedPair(a, b, notes, (settled.only_a, settled.only_b))


def _as_real_pairs(p: Payload) -> Payload:
    """``(real, imaginary)`` along a new last dimension, in float32 (float64 for complex128 and float64)."""
    wide = p.dtype in ("float64", "complex128")
    values = p.values
    if not is_complex(p.dtype):
        values = as_floats(values, p.dtype, np.float64 if wide else np.float32)
    values = np.ascontiguousarray(values, dtype=np.complex128 if wide else np.complex64)
    return Payload(values.view(np.float64 if wide else np.float32).reshape(*values.shape, 2),
                   "float64" if wide else "float32")


def _extremes(p: Payload, *, highest: bool = True) -> tuple[float, float]:
    """The smallest and largest value, NaN left out (chunk by chunk: bits are widened a chunk at a time);
    ``highest=False``: the smallest only (one reduction, a cheap first look), the largest given as -inf."""
    flat = p.values.reshape(-1)
    low, high = math.inf, -math.inf
    for start in range(0, flat.size, _CHUNK):
        chunk = as_floats(flat[start:start + _CHUNK], p.dtype, np.float64 if p.dtype == "float64" else np.float32)
        low = min(low, float(np.fmin.reduce(chunk)))
        if highest:
            high = max(high, float(np.fmax.reduce(chunk)))
    return low, high


def saturated_note(count: int) -> str:
    """The row's note for ``count`` saturated positions treated as equal."""
    return f"{count} saturated values (at their dtype's finite extreme on both sides) treated as equal"


class Settled(NamedTuple):
    """How many positions ``settle_scores`` made equal: saturated alike, masked on both sides, masked in A
    only, masked in B only."""

    saturated: int = 0
    masked: int = 0
    only_a: int = 0
    only_b: int = 0


def settle_saturated(a: Payload, b: Payload, recorded: tuple[Any, Any] | None = None
                     ) -> tuple[Payload, tuple[int, int]]:
    """``settle_scores`` without the positions masked on one side: ``b`` and the (saturated, masked) counts."""
    b, settled = settle_scores(a, b, recorded)
    return b, (settled.saturated, settled.masked)


def settle_scores(a: Payload, b: Payload, recorded: tuple[Any, Any] | None = None, *, one_side: bool = False
                  ) -> tuple[Payload, Settled]:
    """``b`` with positions where both sides saturate alike replaced by ``a``'s value, and their counts (both at
    their extreme; one at its extreme, the other at most ``-5e3``).

    ``one_side``: also the positions masked on one side only, made equal to ``a``'s and counted: one side at
    its dtype's finite extreme (a masked score, ``finfo.min``), the other a plain value above ``-5e3``. Such a
    position is a mask difference, counted in positions by the caller, never a 3.4e38 error. Infinities are
    left alone (an ``-inf`` made by a ``log`` is the op's doing). Each side's extreme is its own dtype's, so
    both passes read the pair converted once.

    One cheap pass over ``a``'s extremes first (none when its recorded extremes are far from them and
    ``one_side`` is off): most tensors hold nothing near them.
    """
    if a.size == 0:
        return b, Settled()
    max_a, max_b = finite_max(a.dtype), finite_max(b.dtype)
    far = recorded is not None and all(isinstance(v, (int, float)) and abs(v) < 0.5 * max_a for v in recorded) \
        and recorded[0] > MASKED_SCORE_AT  # far from its extremes, and nothing masked as older ports mask
    low, high = (math.inf, -math.inf) if far and not one_side else _extremes(a, highest=not far)
    saturates = not far and (low <= MASKED_SCORE_AT or high >= max_a)  # all NaN: (inf, -inf), nothing saturates
    one_sided = one_side and (low <= -max_a or _extremes(b, highest=False)[0] <= -max_b)
    if not (saturates or one_sided):
        return b, Settled()
    target = _promoted(a.dtype, b.dtype)
    work = np.float64 if target == "float64" else np.float32
    wa, wb = as_floats(a.values, a.dtype, work), as_floats(b.values, b.dtype, work)
    saturated = masked = 0
    if saturates:
        both = ((wa <= -max_a) & (wb <= -max_b)) | ((wa >= max_a) & (wb >= max_b))
        # a masked score: one side at its extreme, the other masked by a smaller constant (-1e4 of older ports),
        # possibly with the score added to it (scores + mask, a softmax's input)
        alike = ~both & (((wa <= -max_a) & (wb <= MASKED_SCORE_AT)) | ((wb <= -max_b) & (wa <= MASKED_SCORE_AT)))
        saturated, masked = int(np.count_nonzero(both)), int(np.count_nonzero(alike))
        if saturated + masked:
            same = both | alike
            wb = wb.copy()
            wb[same] = wa[same]
    only_a = only_b = 0
    if one_sided:
        plain_a, plain_b = np.isfinite(wa) & (wa > MASKED_SCORE_AT), np.isfinite(wb) & (wb > MASKED_SCORE_AT)
        in_a_only = np.isfinite(wa) & (wa <= -max_a) & plain_b
        in_b_only = np.isfinite(wb) & (wb <= -max_b) & plain_a
        only_a, only_b = int(np.count_nonzero(in_a_only)), int(np.count_nonzero(in_b_only))
        if only_a + only_b:
            either = in_a_only | in_b_only
            wb = wb.copy()
            wb[either] = wa[either]
            return Payload(wb, "float64" if work is np.float64 else "float32"), \
                Settled(saturated, masked, only_a, only_b)
    if not saturated + masked:
        return b, Settled()
    if target == "float16":
        return Payload(wb.astype(np.float16), target), Settled(saturated, masked)
    if target in ("bfloat16",):  # both sides bf16: keep the bits, so the pair still reads as one dtype
        return Payload((wb.view(np.uint32) >> 16).astype(np.uint16), target), Settled(saturated, masked)
    return Payload(wb, target), Settled(saturated, masked)


def _promoted(x: str, y: str) -> str:
    """torch's result dtype of two floating dtypes, float8 taken as float32 first (it has no kernels)."""
    x, y = ("float32" if d.startswith("float8") else d for d in (x, y))
    if x == y:
        return x
    return "float64" if "float64" in (x, y) else "float32"


def exact_mismatches(a: Any, b: Any) -> int:
    """How many positions of an integer or bool pair differ, compared in 64-bit integers (no rounding)."""
    a, b = payload_of(a), payload_of(b)
    return int(np.count_nonzero(a.values.astype(np.int64) != b.values.astype(np.int64)))
