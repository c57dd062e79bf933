"""Attention masks compared as masks: which positions they mask, whatever their convention.

Two implementations rarely write a mask alike: a boolean keep-mask (``True``: may attend, what
``scaled_dot_product_attention`` takes), a boolean drop-mask (``True``: masked, what
``nn.MultiheadAttention`` takes), an additive mask (0 and a large negative value: ``-inf``, ``-1e4`` or
``finfo(dtype).min`` of any float dtype), a 0/1 keep-mask in floats or integers (a tokenizer's
``attention_mask``), each 2-D, broadcast or expanded to 4-D. Compared value by value, a boolean against an
additive mask differs by 3.4e38 at every masked position, for masks that mean the same.

A tensor's **readings** are the conventions it can be read in, each with the positions it masks then. Two
tensors are the same mask when some reading of one and some reading of the other mask the same positions
(after broadcasting to one shape): a benign difference, said so in the row. When no readings agree, the
pair is a **mask difference**: compared as the positions each masks, so that the row counts the positions
masked on one side only instead of reporting 1e38-sized errors.

Two boolean tensors are compared as they are (a keep-mask against its complement may well be a bug:
only the kernel that reads them knows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace.payload import Payload, as_floats, is_floating

#: an additive mask's masked value is at most this (``-1e4`` of older BERT ports, ``finfo.min``, ``-inf``)
MASKED_AT = -1e4
_MAX_MASK_ELEMENTS = 1 << 24  # masks are small; a larger tensor is not read as one


@dataclass(frozen=True)
class MaskPair:
    """A pair read as masks: the positions each side masks (one shape), and what the row says."""

    a: np.ndarray
    b: np.ndarray
    note: str
    convention_b: str  # how B writes its mask (replay writes A's positions that way)

    @property
    def same(self) -> bool:
        return bool(np.array_equal(self.a, self.b))


def readings(values: np.ndarray, dtype: str) -> dict[str, np.ndarray]:
    """The conventions ``values`` can be read in, each with the positions it masks (empty: not a mask)."""
    if values.size > _MAX_MASK_ELEMENTS:
        return {}
    if dtype == "bool":
        kept = values.astype(bool)
        return {"boolean keep": ~kept, "boolean drop": kept}
    if is_floating(dtype):
        floats = as_floats(values, dtype, np.float64 if dtype == "float64" else np.float32)
    elif dtype.startswith(("int", "uint")):
        floats = values.astype(np.float64)
    else:
        return {}
    if np.isnan(floats).any():
        return {}
    out: dict[str, np.ndarray] = {}
    zero = floats == 0
    if (zero | (floats == 1)).all():
        out["0/1 keep"] = zero
    if is_floating(dtype):
        masked = floats <= MASKED_AT
        if (zero | masked).all():
            out["additive"] = masked
    return out


def may_be_mask(dtype: str | None, stats: dict[str, float]) -> bool:
    """Can a recorded tensor be an attention mask, by its dtype and statistics alone (no payload read)? A
    boolean; integers or floats between 0 and 1; floats between a large negative value and 0. Unknown
    statistics do not rule it out."""
    dtype = (dtype or "").removeprefix("torch.")
    if dtype == "bool":
        return True
    low, high = stats.get("min"), stats.get("max")
    if not isinstance(low, (int, float)) or not isinstance(high, (int, float)):
        return True
    return (low >= 0 and high <= 1) or (high == 0 and (low <= MASKED_AT or low == 0))


def is_mask(dtype: str | None, stats: dict[str, float]) -> bool:
    """Is a recorded tensor surely an attention mask, by its dtype and statistics alone? A boolean, or floats
    between a large negative value and 0 with both levels present (an additive mask). A 0/1 float tensor may be
    a mask or numbers: not sure."""
    dtype = (dtype or "").removeprefix("torch.")
    if dtype == "bool":
        return True
    low, high = stats.get("min"), stats.get("max")
    return isinstance(low, (int, float)) and isinstance(high, (int, float)) and high == 0 and low <= MASKED_AT


def kinds_apart(dtype_a: str | None, stats_a: dict[str, float], dtype_b: str | None, stats_b: dict[str, float]
                ) -> bool:
    """Is one tensor surely a mask and the other surely not (numbers: a rotary table, hidden states)? Such a
    pair is never one tensor, whatever its shape: a mask pairs with a mask."""
    return (is_mask(dtype_a, stats_a) and not may_be_mask(dtype_b, stats_b)) or \
        (is_mask(dtype_b, stats_b) and not may_be_mask(dtype_a, stats_a))


def _has_masked(found: dict[str, np.ndarray], dtype: str) -> bool:
    """Does the tensor hold a masked value that no plain number would (a boolean, or a large negative)?"""
    return dtype == "bool" or bool("additive" in found and found["additive"].any())


def _shaped(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Both broadcast to one shape; a 2-D padding mask ``[B, S]`` is taken as ``[B, 1, 1, S]`` against 4-D."""
    for first, second in ((x, y), (x.reshape(x.shape[0], 1, 1, x.shape[1]) if x.ndim == 2 and y.ndim == 4 else x,
                                   y.reshape(y.shape[0], 1, 1, y.shape[1]) if y.ndim == 2 and x.ndim == 4 else y)):
        try:
            shape = np.broadcast_shapes(first.shape, second.shape)
        except ValueError:
            continue
        if np.prod(shape) <= _MAX_MASK_ELEMENTS:
            return np.broadcast_to(first, shape), np.broadcast_to(second, shape)
    return None


def as_masks(a: Payload, b: Payload) -> MaskPair | None:
    """``a`` and ``b`` read as attention masks when they are masks in other conventions or layouts; None for
    any other pair (numbers, two masks written alike, two booleans of one shape)."""
    if a.dtype == b.dtype and a.shape == b.shape and not is_floating(a.dtype):
        return None  # two booleans (or integers) of one shape: compared value by value
    found_a, found_b = readings(a.values, a.dtype), readings(b.values, b.dtype)
    if not found_a or not found_b or not (_has_masked(found_a, a.dtype) or _has_masked(found_b, b.dtype)):
        return None
    if a.dtype == b.dtype and a.shape == b.shape and set(found_a) == set(found_b) != {"additive"}:
        return None  # floats of one dtype, shape and kind: compared value by value
    if a.dtype == "bool" and b.dtype == "bool":  # one shape apart: the same convention on both sides
        found_a = {"boolean keep": found_a["boolean keep"]}
        found_b = {"boolean keep": found_b["boolean keep"]}
    best: tuple[int, str, str, np.ndarray, np.ndarray] | None = None
    for name_a, masked_a in found_a.items():
        for name_b, masked_b in found_b.items():
            shaped = _shaped(masked_a, masked_b)
            if shaped is None:
                continue
            apart = int(np.count_nonzero(shaped[0] != shaped[1]))
            if best is None or apart < best[0]:
                best = (apart, name_a, name_b, *shaped)
    if best is None:
        return None
    apart, name_a, name_b, masked_a, masked_b = best
    conventions = f"A {name_a} {_shape(a.shape)}, B {name_b} {_shape(b.shape)}"
    if not apart:
        return MaskPair(masked_a, masked_b, f"the same mask in other conventions ({conventions}): "
                                            f"{int(np.count_nonzero(masked_a))} masked positions on both sides",
                        name_b)
    only_a = int(np.count_nonzero(masked_a & ~masked_b))
    only_b = int(np.count_nonzero(masked_b & ~masked_a))
    return MaskPair(masked_a, masked_b, f"mask difference ({conventions}): {only_a} position(s) masked in A "
                                        f"only, {only_b} in B only", name_b)


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"

