"""Statistics of accelerator tensors, computed where the tensor lives and read back in batches.

Reading a statistic back from a GPU (``.item()``, ``.tolist()``) waits for
every kernel queued before it: one such wait per recorded tensor serializes
the forward with the capture. ``DeviceStats.launch`` only queues kernels: per
chunk of at most ``CHUNK`` elements, a float64 copy ``y`` of the chunk, the
counts of finite, NaN and +Inf elements, the finite minimum and maximum, then
``y`` with every non-finite element set to 0 and the same sums as
:mod:`tracediff.capturing.stats` (sum, ``y.y``, ``sign(y).y``,
``sign(y).sign(y)``). No branch depends on the data, so nothing waits. The
nine numbers of each chunk stay on the device until ``resolve``, which reads
every pending tensor's numbers in one transfer per device and fills in the
entries' statistics in place. A capture resolves every ``batch`` tensors
(default 256) and when it ends.

The keys and their meaning are those of ``tensor_stats``. The sums run in
float64, so for float32 and narrower tensors the moments can differ from the
host path's float32 sums in the last digits; counts, min and max are exact.
Integer and bool tensors get ``numel``, ``min``, ``max`` and ``zeros`` the
same way; complex tensors and unsigned integers wider than 8 bits are
measured directly (rare, and torch lacks the kernels on some devices).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

from .stats import CHUNK, FLOAT_DTYPES, StatsBuffers, string_fields, tensor_stats

DEFAULT_BATCH = 256
# Devices whose tensors are measured directly: on the host a read-back costs nothing, extra kernels do.
_DEVICES_READ_DIRECTLY = {"cpu", "meta"}
_WIDE_UNSIGNED = {getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)}


def measured_on_device(tensor: torch.Tensor) -> bool:
    """True when ``tensor``'s statistics are queued on its device and read back later."""
    return tensor.device.type not in _DEVICES_READ_DIRECTLY


class DeviceStats:
    """Pending statistics of device tensors; ``resolve`` reads them all back at once."""

    def __init__(self, buffers: StatsBuffers, *, batch: int = DEFAULT_BATCH) -> None:
        self.batch = batch
        self._buffers = buffers
        # (entry to fill, its stats dict, numel, dtype, kind, per-chunk partials on the device)
        self._pending: list[tuple[dict[str, Any], dict[str, Any], int, torch.dtype, str, list[torch.Tensor]]] = []

    def __len__(self) -> int:
        return len(self._pending)

    def launch(self, tensor: torch.Tensor, entry: dict[str, Any], stats: dict[str, Any]) -> None:
        """Queue the kernels for ``tensor``; ``stats`` (and ``entry``'s string fields) are filled by ``resolve``."""
        t = tensor.detach()
        n = t.numel()
        if n == 0 or t.is_complex() or t.dtype in _WIDE_UNSIGNED:
            self._fill(entry, stats, tensor_stats(t, buffers=self._buffers), t.dtype)
            return
        kind = "float" if t.dtype in FLOAT_DTYPES else "bool" if t.dtype == torch.bool else "int"
        flat = t.reshape(-1)
        parts = [self._float_chunk(flat[start:start + CHUNK]) if kind == "float" else _integer_chunk(
            flat[start:start + CHUNK]) for start in range(0, n, CHUNK)]
        self._pending.append((entry, stats, n, t.dtype, kind, parts))
        if len(self._pending) >= self.batch:
            self.resolve()

    def _float_chunk(self, x: torch.Tensor) -> torch.Tensor:
        m = x.numel()
        y = self._buffers.get(x.device, torch.float64, m, slot=2).copy_(x)
        finite = torch.isfinite(y)
        counts = torch.stack((finite.sum(), torch.isnan(y).sum(), torch.isposinf(y).sum()))
        lo = torch.where(finite, y, math.inf).amin()
        hi = torch.where(finite, y, -math.inf).amax()
        y.nan_to_num_(0.0, 0.0, 0.0)
        signs = torch.sign(y, out=self._buffers.get(x.device, torch.float64, m, slot=3))
        sums = torch.stack((lo, hi, y.sum(), torch.dot(y, y), torch.dot(signs, y), torch.dot(signs, signs)))
        return torch.cat((sums, counts.double()))

    def resolve(self) -> None:
        """Read back every pending statistic (one transfer per device) and fill in the entries."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        by_device: defaultdict[torch.device, list[torch.Tensor]] = defaultdict(list)
        for *_, parts in pending:
            by_device[parts[0].device].extend(parts)
        values = {device: _read_back(parts) for device, parts in by_device.items()}
        offsets = dict.fromkeys(values, 0)
        for entry, stats, n, dtype, kind, parts in pending:
            device = parts[0].device
            chunks = []
            for part in parts:
                size = part.numel()
                chunks.append(values[device][offsets[device]:offsets[device] + size])
                offsets[device] += size
            result = _float_result(n, chunks) if kind == "float" else _integer_result(n, kind, chunks)
            self._fill(entry, stats, result, dtype)

    @staticmethod
    def _fill(entry: dict[str, Any], stats: dict[str, Any], result: dict[str, Any], dtype: torch.dtype) -> None:
        stats.clear()
        stats.update(result)
        if dtype in FLOAT_DTYPES and result.get("numel"):
            entry.update(string_fields(result, dtype))  # the placeholders keep their place in the entry


def placeholder_strings(tensor: torch.Tensor) -> dict[str, str] | None:
    """The string fields an entry will get once resolved, as empty strings that hold their place."""
    if tensor.dtype in FLOAT_DTYPES and tensor.numel():
        return {key: "" for key in ("mean", "std", "min", "max")}
    return None


def _integer_chunk(x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.bool:
        return x.sum().reshape(1)
    lo, hi = torch.aminmax(x)
    return torch.stack((lo.long(), hi.long(), torch.count_nonzero(x)))


def _read_back(parts: list[torch.Tensor]) -> list[float | int]:
    """The values of ``parts`` in order: one transfer for the float64 ones, one for the int64 (exact) ones."""
    floats = [p for p in parts if p.dtype == torch.float64]
    ints = [p for p in parts if p.dtype == torch.int64]
    float_values = iter(torch.cat(floats).tolist() if floats else [])
    int_values = iter(torch.cat(ints).tolist() if ints else [])
    out: list[float | int] = []
    for p in parts:
        source = float_values if p.dtype == torch.float64 else int_values
        out.extend(next(source) for _ in range(p.numel()))
    return out


def _float_result(n: int, chunks: list[list[float | int]]) -> dict[str, Any]:
    lo = min(c[0] for c in chunks)
    hi = max(c[1] for c in chunks)
    total, squares, abs_total = (math.fsum(c[k] for c in chunks) for k in (2, 3, 4))
    nonzero = round(math.fsum(c[5] for c in chunks))
    finite, nan, posinf = (round(math.fsum(c[k] for c in chunks)) for k in (6, 7, 8))
    neginf = n - finite - nan - posinf
    mean = total / finite if finite else math.nan
    var = (squares - total * total / finite) / (finite - 1) if finite > 1 else math.nan
    std = math.sqrt(var) if var > 0 else (0.0 if var == var else math.nan)
    abs_mean = abs_total / finite if finite else math.nan
    zeros = finite - nonzero
    if finite == n:  # the key order of tensor_stats for finite tensors
        return {"numel": n, "min": lo, "max": hi, "nan": 0, "posinf": 0, "neginf": 0, "mean": mean, "std": std,
                "abs_mean": abs_mean, "zeros": zeros}
    low = -math.inf if neginf else (lo if finite else math.nan)
    high = math.inf if posinf else (hi if finite else math.nan)
    return {"numel": n, "nan": nan, "posinf": posinf, "neginf": neginf, "zeros": zeros, "mean": mean, "std": std,
            "abs_mean": abs_mean, "min": low, "max": high}


def _integer_result(n: int, kind: str, chunks: list[list[float | int]]) -> dict[str, Any]:
    if kind == "bool":
        true_count = int(sum(c[0] for c in chunks))
        return {"numel": n, "min": int(true_count == n), "max": int(true_count > 0), "zeros": n - true_count}
    return {"numel": n, "min": int(min(c[0] for c in chunks)), "max": int(max(c[1] for c in chunks)),
            "zeros": n - int(sum(c[2] for c in chunks))}
