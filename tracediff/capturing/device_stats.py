"""Statistics of accelerator tensors, computed where the tensor lives and read back in batches.

Reading a statistic back from a GPU (``.item()``, ``.tolist()``) waits for
every kernel queued before it: one such wait per recorded tensor serializes
the forward with the capture. ``DeviceStats.launch`` only queues kernels: for a
floating CUDA tensor, when Triton can be imported, the one fused kernel of
:mod:`tracediff.capturing.fused_stats` (one read of the tensor); otherwise those of
:func:`tracediff.capturing.stats.wide_partials` (or ``integer_partials``) per chunk
of at most ``DEVICE_CHUNK`` elements. No branch depends on the data, so nothing waits.
The partials stay on the device until ``resolve``, which reads
every pending tensor's numbers in one transfer per device and fills in the
entries' statistics in place with the same ``float_summary`` /
``integer_summary`` as the host path. A capture resolves every ``batch``
tensors (default 256) and when it ends.

The keys and their meaning are those of ``tensor_stats``. The sums run in
float64 (the fused kernel's: in float32 within blocks of 1,024 elements, as the
host path sums float32, and in float64 beyond), so for float32 and narrower
tensors the moments can differ from the host path's in the last digits; counts,
min and max are exact.
Complex tensors and unsigned integers wider than 8 bits are measured directly
(rare, and torch lacks the kernels on some devices).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from .fused_stats import fused_available, fused_partials
from .stats import (
    FLOAT_DTYPES,
    WIDE_UNSIGNED,
    StatsBuffers,
    fill_entry_stats,
    float_summary,
    integer_partials,
    integer_summary,
    tensor_stats,
    wide_partials,
)

DEFAULT_BATCH = 256
# Elements per chunk on a device. Each chunk costs the host about 20 kernel launches: measured on an H200,
# chunks of 2**20 made a summary capture 3 times slower than 2**22; 2**24 gained 7-14% more for 4 times the
# device memory (two float64 work buffers of 32 MiB here).
DEVICE_CHUNK = 1 << 22
# Devices whose tensors are measured directly: on the host a read-back costs nothing, extra kernels do.
_DEVICES_READ_DIRECTLY = {"cpu", "meta"}


def measured_on_device(tensor: torch.Tensor) -> bool:
    """True when ``tensor``'s statistics are queued on its device and read back later."""
    return tensor.device.type not in _DEVICES_READ_DIRECTLY


class DeviceStats:
    """Pending statistics of device tensors; ``resolve`` reads them all back at once."""

    def __init__(self, buffers: StatsBuffers, *, batch: int | None = None) -> None:
        self.batch = DEFAULT_BATCH if batch is None else batch
        self._buffers = buffers
        # (entry to fill, its stats dict, numel, dtype, kind, per-chunk partials on the device)
        self._pending: list[tuple[dict[str, Any], dict[str, Any], int, torch.dtype, str, list[torch.Tensor]]] = []
        self._waiting: list[Callable[[], None]] = []  # run once the statistics pending now are filled in
        self._lock = threading.RLock()  # ``after_resolved`` is also called from payload writer threads

    def __len__(self) -> int:
        return len(self._pending)

    def launch(self, tensor: torch.Tensor, entry: dict[str, Any], stats: dict[str, Any]) -> None:
        """Queue the kernels for ``tensor``; ``stats`` (and ``entry``'s string fields) are filled by ``resolve``."""
        t = tensor.detach()
        n = t.numel()
        if n == 0 or t.is_complex() or t.dtype in WIDE_UNSIGNED:
            fill_entry_stats(entry, stats, tensor_stats(t, buffers=self._buffers), t.dtype)
            return
        kind = "float" if t.dtype in FLOAT_DTYPES else "bool" if t.dtype == torch.bool else "int"
        flat = t.reshape(-1)
        chunk = DEVICE_CHUNK
        if kind == "float" and fused_available(flat):
            parts = [fused_partials(flat)]
        else:
            parts = [wide_partials(flat[start:start + chunk], self._buffers) if kind == "float" else
                     integer_partials(flat[start:start + chunk]) for start in range(0, n, chunk)]
        with self._lock:
            self._pending.append((entry, stats, n, t.dtype, kind, parts))
            full = len(self._pending) >= self.batch
        if full:
            self.resolve()

    def after_resolved(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once every statistic queued so far is filled in: now when none is pending."""
        with self._lock:
            if self._pending:
                self._waiting.append(callback)
                return
        callback()

    def resolve(self) -> None:
        """Read back every pending statistic (one transfer per device), fill in the entries, then run the
        callbacks that waited for them."""
        with self._lock:
            self._fill_pending()
            waiting, self._waiting = self._waiting, []
        for callback in waiting:
            callback()

    def _fill_pending(self) -> None:
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
            result = float_summary(n, chunks) if kind == "float" else integer_summary(n, kind, chunks)
            fill_entry_stats(entry, stats, result, dtype)


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
