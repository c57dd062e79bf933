"""A tensor's statistics on a GPU in one read: one fused Triton kernel, used when Triton can be imported.

:func:`tracediff.capturing.stats.wide_partials` measures a chunk with about twenty kernels (a float64 copy,
``isfinite``, ``isnan``, ``where``, ``amin``, ``amax``, ``nan_to_num``, ``sign``, three dot products, ...),
each reading the chunk again. ``fused_partials`` gives the same nine partials of a whole tensor,
``(finite min, finite max, sum, x.x, |x| sum, non-zeros, finite, nan, +inf)``, from one kernel that reads
each element once, plus one small kernel per column that combines the blocks' partials:

* each program reads ``BLOCK`` elements, converts them to float32 (float64 for a float64 tensor) and
  reduces them to its nine partials: sums over the finite elements, counts as exact integers;
* the blocks' partials are written as float64 and combined in float64 (sums and counts) or exactly
  (minimum and maximum).

So a float32 or narrower tensor is summed in float32 over at most ``BLOCK`` elements and in float64
beyond, as the host's ``fast_partials`` sums float32 chunks and combines them in float64; a float64
tensor is summed in float64 throughout. The moments can differ from ``wide_partials``' (float64 per
element) in the last digits (tests/capturing/test_fused_stats.py states by how much); counts, minimum and
maximum are exact. ``float_summary`` turns the partials into the recorded keys, as for every other path.

Triton ships with PyTorch's CUDA builds; it is imported only when a CUDA tensor is measured, and never
required: without it (or for another device or dtype) ``wide_partials`` is used as before. With
``TRITON_INTERPRET=1`` the same kernel runs on CPU tensors, which is how its maths is tested without a GPU.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from .stats import WIDE_PARTS

BLOCK = 1024
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def fused_available(tensor: torch.Tensor) -> bool:
    """True when ``tensor`` can be measured by the fused kernel: a CUDA floating tensor (a CPU one under
    Triton's interpreter) and Triton importable."""
    on_device = tensor.is_cuda or (tensor.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1")
    return on_device and tensor.dtype in _DTYPES and tensor.numel() > 0 and _kernel() is not None


def fused_partials(x: torch.Tensor) -> torch.Tensor:
    """The nine ``wide_partials`` of the whole of ``x`` (float64, on its device), from one pass over it.

    Nothing waits for the device: the result is read back later (``DeviceStats.resolve``).
    """
    kernel = _kernel()
    if kernel is None:
        raise RuntimeError("fused_partials needs Triton: check fused_available first")
    flat = x.detach().reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    n = flat.numel()
    blocks = -(-n // BLOCK)
    parts = torch.empty((blocks, WIDE_PARTS), dtype=torch.float64, device=flat.device)
    kernel[(blocks,)](flat, parts, n, BLOCK=BLOCK, WIDE=flat.dtype == torch.float64)
    sums = parts[:, 2:].sum(dim=0)
    return torch.cat((parts[:, 0].amin().reshape(1), parts[:, 1].amax().reshape(1), sums))


@functools.lru_cache(maxsize=1)
def _kernel() -> Any:
    """The Triton kernel, compiled lazily; None when Triton cannot be imported."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def partials(x_ptr, out_ptr, n, BLOCK: tl.constexpr, WIDE: tl.constexpr):
        pid = tl.program_id(0)
        offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        raw = tl.load(x_ptr + offsets, mask=inside, other=0.0)
        x = raw.to(tl.float64) if WIDE else raw.to(tl.float32)
        nan = x != x
        finite = inside & ((x - x) == 0)  # inf - inf and NaN - NaN are NaN
        posinf = inside & (x > 0) & ~finite & ~nan
        y = tl.where(finite, x, 0.0)
        lo = tl.min(tl.where(finite, x, float("inf")), axis=0)
        hi = tl.max(tl.where(finite, x, float("-inf")), axis=0)
        total = tl.sum(y, axis=0)
        squares = tl.sum(y * y, axis=0)
        absolute = tl.sum(tl.abs(y), axis=0)
        nonzero = tl.sum((y != 0).to(tl.int32), axis=0)
        count = tl.sum(finite.to(tl.int32), axis=0)
        nans = tl.sum((inside & nan).to(tl.int32), axis=0)
        infs = tl.sum(posinf.to(tl.int32), axis=0)
        row = out_ptr + pid.to(tl.int64) * 9
        tl.store(row + 0, lo.to(tl.float64))
        tl.store(row + 1, hi.to(tl.float64))
        tl.store(row + 2, total.to(tl.float64))
        tl.store(row + 3, squares.to(tl.float64))
        tl.store(row + 4, absolute.to(tl.float64))
        tl.store(row + 5, nonzero.to(tl.float64))
        tl.store(row + 6, count.to(tl.float64))
        tl.store(row + 7, nans.to(tl.float64))
        tl.store(row + 8, infs.to(tl.float64))

    return partials
