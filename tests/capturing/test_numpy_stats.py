"""``numpy_stats`` (the statistics of an MLX capture) gives ``tensor_stats``' keys and values.

Counts, minimum and maximum are exact on both; the sums are float64 in numpy and float32 (or float64 for
tensors with non-finite elements) in ``tensor_stats``, so mean, std and abs_mean agree within the rounding
bound of those sums in any order (``_allowed``, from ``tests/rounding.py``), not bit for bit.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import torch

from tests.rounding import U32, U64, gamma
from tracediff.capturing.stats import CHUNK, numpy_stats, tensor_stats

SUMS = ("mean", "std", "abs_mean")


def _allowed(key: str, ref: dict[str, Any], dtype: torch.dtype) -> float:
    """How far ``tensor_stats``' ``key`` may be from ``numpy_stats``' ``ref``: its sums run in float32 over chunks
    of ``CHUNK`` (float64 for a float64 tensor), each within ``gamma(m + 1)`` of ``sum |terms|`` in any order;
    numpy's float64 sums within ``gamma(n + 1, U64)``. Sum of x within ``e n abs_mean``, of x^2 within ``e S2``;
    std through ``var = (S2 - T^2 / n) / (n - 1)`` to first order: ``d std = d var / (2 std)``."""
    n = ref["numel"] - ref["nan"] - ref["posinf"] - ref["neginf"]
    u = U64 if dtype == torch.float64 else U32
    e = gamma(min(n, CHUNK) + 1, u) + gamma(n + 1, U64) + 2 * U64
    mean, abs_mean, std = ref["mean"], ref["abs_mean"], ref["std"]
    if key == "mean":
        return e * abs_mean
    if key == "abs_mean":
        return e * abs_mean
    s2 = (n - 1) * std * std + n * mean * mean
    dvar = e * (s2 + 2 * n * abs(mean) * abs_mean) / (n - 1)
    return dvar / (2 * std) if std > 0 else math.sqrt(dvar)


def tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 33, generator=g)
    special = x.clone()
    special[0, :3] = torch.tensor([math.nan, math.inf, -math.inf])
    return [
        ("float32", x),
        ("zeros", torch.zeros(5, 3)),
        ("bfloat16", x.to(torch.bfloat16)),
        ("float16", x.to(torch.float16)),
        ("float64", x.double()),
        ("nan-inf", special),
        ("all-nan", torch.full((4,), math.nan)),
        ("two-chunks", torch.randn(CHUNK + 7, generator=g)),
        ("int64", torch.randint(-5, 5, (7, 9), generator=g)),
        ("uint8", torch.randint(0, 255, (40,), generator=g, dtype=torch.uint8)),
        ("bool", torch.rand(30, generator=g) > 0.5),
        ("empty", torch.zeros(0, 4)),
        ("complex", torch.zeros(3, dtype=torch.complex64)),
    ]


@pytest.mark.parametrize(("name", "tensor"), tensors(), ids=[name for name, _ in tensors()])
def test_numpy_stats_agree_with_tensor_stats(name: str, tensor: torch.Tensor) -> None:
    ours, theirs = numpy_stats(tensor), tensor_stats(tensor)
    assert list(ours) == list(theirs)  # the same keys in the same order
    for key, value in theirs.items():
        if key in SUMS and isinstance(value, float) and math.isfinite(value):
            assert abs(ours[key] - value) <= _allowed(key, ours, tensor.dtype), key
        elif isinstance(value, float) and math.isnan(value):
            assert math.isnan(ours[key]), key
        else:
            assert ours[key] == value, key


def _compiled_cases() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    blocks = torch.randn(3 * 2048 + 5, generator=g)
    blocks[2048 + 17] = math.nan  # a non-finite element in the second block only: that block's strict extremes
    blocks[3 * 2048 + 2] = -math.inf
    signed = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 3.0e38, -3.0e38])  # zeros, subnormals, float32's range
    huge = torch.tensor([1e200, -1e200, 5.0], dtype=torch.float64)  # float64 squares overflow alike
    # one chunk, its blocks of every kind: finite, finite but too large to square in float64, holding a NaN
    mixed = torch.randn(4 * 2048, generator=g, dtype=torch.float64)
    mixed[2048:4096] *= 1e160
    mixed[3 * 2048 + 9] = math.nan
    only = torch.full((2049,), math.inf)
    only[7] = math.nan
    return [("one", torch.tensor([2.5])), ("blocks", blocks), ("signed", signed), ("huge", huge),
            ("mixed blocks", mixed), ("non-finite only", only),
            ("chunks", torch.randn(2 * CHUNK + 3, generator=g) * 1e3 + 7),
            ("float16", torch.randn(5000, generator=g).half()), ("bfloat16", torch.randn(5000, generator=g).bfloat16()),
            *tensors()]


@pytest.mark.parametrize(("name", "tensor"), _compiled_cases(), ids=[name for name, _ in _compiled_cases()])
def test_the_compiled_statistics_are_numpys(name: str, tensor: torch.Tensor, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    """The C build's one pass against numpy's: counts, minimum and maximum exact; each float64 sum within
    ``gamma(n + 1, U64)`` of ``sum |terms|`` in any order on both sides (so mean, abs_mean and std within twice
    that, through the same formulas as ``_allowed``)."""
    from tracediff.capturing.stats import _compiled_stats
    from tracediff.native import fused_c

    if fused_c.compiler() is None:
        pytest.skip("no C compiler: the numpy path is the only one")
    if os.environ.get("TRACEDIFF_KERNEL", "") in ("numpy", "numba"):
        pytest.skip("TRACEDIFF_KERNEL turns the compiled statistics off for this run")
    assert _compiled_stats() is not None  # a compiler is here: the C build must load
    compiled = numpy_stats(tensor)
    monkeypatch.setenv("TRACEDIFF_KERNEL", "numpy")
    reference = numpy_stats(tensor)
    assert list(compiled) == list(reference)
    n = reference["numel"] - reference.get("nan", 0) - reference.get("posinf", 0) - reference.get("neginf", 0)
    for key, value in reference.items():
        if key in SUMS and isinstance(value, float) and math.isfinite(value) and n > 1:
            bound = 2 * gamma(n + 1, U64) * (abs(reference["abs_mean"]) if key != "std" else 1.0)
            if key == "std":
                mean, std, abs_mean = reference["mean"], reference["std"], reference["abs_mean"]
                s2 = (n - 1) * std * std + n * mean * mean
                dvar = 2 * gamma(n + 1, U64) * (s2 + 2 * n * abs(mean) * abs_mean) / (n - 1)
                bound = dvar / (2 * std) if std > 0 else math.sqrt(dvar)
            assert abs(compiled[key] - value) <= bound, key
        elif isinstance(value, float) and math.isnan(value):
            assert math.isnan(compiled[key]), key
        else:
            assert compiled[key] == value, key


def test_the_compiled_statistics_refuse_what_they_cannot_read() -> None:
    import numpy as np

    from tracediff.capturing.stats import _compiled_stats

    compiled = _compiled_stats()
    if compiled is None:
        pytest.skip("no C build here")
    for bad in (np.zeros(4, dtype=np.float16), np.zeros((2, 2), dtype=np.float32), np.zeros(8, np.float32)[::2],
                np.zeros(0, np.float32), np.zeros(4, dtype=">f4")):
        with pytest.raises(ValueError, match="compiled statistics"):
            compiled.stats(bad, 4)
