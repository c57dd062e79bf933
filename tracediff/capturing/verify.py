"""Checking that capture did not change what it observed.

Two model outputs are compared leaf by leaf through their nesting (tuples,
lists, dicts, dataclasses). Tensors must match in shape, dtype and every bit
(NaN payloads included); other leaves must be equal. An object recorded inside a compiled graph by its
type name only (a cache: ``record_op.Opaque``) is not compared: the capture never saw it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from ..files.payloads import byte_view
from .record_op import Opaque


@dataclass(frozen=True)
class Verification:
    """The outcome of ``verify=True``: truthy when the outputs were bit-identical."""

    identical: bool
    compared: int
    differences: tuple[str, ...]

    def __bool__(self) -> bool:
        return self.identical

    def to_dict(self) -> dict[str, Any]:
        return {"identical": self.identical, "compared": self.compared, "differences": list(self.differences)}


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.numel() == 0:
        return True
    return bool(torch.equal(byte_view(a), byte_view(b)))


def _max_abs_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest ``|a - b|``; equal infinities and NaN against NaN count 0, NaN against a number inf."""
    a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
    same = (a64 == b64) | (a64.isnan() & b64.isnan())
    diff = (a64 - b64).abs().masked_fill(same, 0.0).nan_to_num(nan=math.inf)
    return float(diff.max()) if diff.numel() else 0.0


def compare_outputs(captured: Any, plain: Any) -> Verification:
    """Compare the output of the captured call with the output of a plain call."""
    differences: list[str] = []
    count = _walk(captured, plain, "outputs", differences)
    return Verification(identical=not differences, compared=count, differences=tuple(differences))


def _walk(a: Any, b: Any, where: str, differences: list[str], depth: int = 0) -> int:
    if depth > 64 or isinstance(a, Opaque):  # an object a compiled graph did not keep (record_op.py): not seen
        return 0
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            differences.append(f"{where}: a tensor on one side only")
        elif a.shape != b.shape or a.dtype != b.dtype:
            differences.append(f"{where}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
        elif not _bitwise_equal(a, b):
            diff = _max_abs_difference(a, b)
            if diff == 0:
                differences.append(f"{where}: bits differ, values equal (signed zeros or NaN payloads)")
            else:
                differences.append(f"{where}: values differ (max abs difference {diff:.3g})")
        return 1
    if dataclasses.is_dataclass(a) and not isinstance(a, type) and type(a) is type(b) and not isinstance(a, dict):
        a = {f.name: getattr(a, f.name) for f in dataclasses.fields(a)}
        b = {f.name: getattr(b, f.name) for f in dataclasses.fields(b)}
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            differences.append(f"{where}: keys {list(a)} vs {list(b)}")
            return 0
        return sum(_walk(a[k], b[k], f"{where}.{k}", differences, depth + 1) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            differences.append(f"{where}: {len(a)} items vs {len(b)}")
            return 0
        return sum(_walk(x, y, f"{where}.{i}", differences, depth + 1) for i, (x, y) in enumerate(zip(a, b)))
    if type(a) is type(b) and type(a).__eq__ is object.__eq__ and hasattr(a, "__dict__"):
        # Objects compared by identity (caches, containers): compare what they hold.
        return _walk(vars(a), vars(b), where, differences, depth + 1)
    try:
        same = bool(a == b)
    except Exception:  # noqa: BLE001 - objects without a usable ==
        same = repr(a) == repr(b)
    if not same:
        differences.append(f"{where}: {a!r} vs {b!r}")
    return 1
