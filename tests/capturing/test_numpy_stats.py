"""``numpy_stats`` (the statistics of an MLX capture) gives ``tensor_stats``' keys and values.

Counts, minimum and maximum are exact on both; the sums are float64 in numpy and float32 (or float64 for
tensors with non-finite elements) in ``tensor_stats``, so mean, std and abs_mean agree within float32's
rounding of a sum over the tensor (rtol 1e-5 for these sizes), not bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch

from tracediff.capturing.stats import CHUNK, numpy_stats, tensor_stats

SUMS = ("mean", "std", "abs_mean")


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
            assert ours[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
        elif isinstance(value, float) and math.isnan(value):
            assert math.isnan(ours[key]), key
        else:
            assert ours[key] == value, key
