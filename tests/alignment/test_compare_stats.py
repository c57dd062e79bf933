"""The approximate verdict from recorded statistics (rows marked ``approximate``), one test per clause."""

from __future__ import annotations

import math

import torch

from tracediff.alignment.compare import compare_stats
from tracediff.capturing.stats import tensor_stats
from tracediff.trace.load import parse_scalar
from tracediff.trace.model import TensorRecord


def native(tensor: torch.Tensor) -> TensorRecord:
    """A record as tracediff writes it: numeric statistics."""
    return TensorRecord(slot="outputs", order=0, shape=tuple(tensor.shape), dtype=str(tensor.dtype),
                        stats=tensor_stats(tensor))


def standard(tensor: torch.Tensor) -> TensorRecord:
    """A record as transformers' debugger writes it: reprs of 0-d tensors in sci_mode, five digits."""
    torch.set_printoptions(sci_mode=True)
    try:
        strings = {k: repr(getattr(tensor, k)()) for k in ("mean", "std", "min", "max")}
    finally:
        torch.set_printoptions(profile="default")
    stats = {k: v for k, text in strings.items() if (v := parse_scalar(text)) is not None}
    return TensorRecord(slot="outputs", order=0, shape=tuple(tensor.shape), dtype=str(tensor.dtype), stats=stats)


X = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 3


def test_five_digit_statistics_of_the_same_tensor_are_close() -> None:
    a, b = standard(X), native(X)
    assert a.stats["std"] != b.stats["std"]  # rounded to five digits
    for ra, rb in ((a, b), (b, a), (a, a)):
        verdict = compare_stats(ra, rb, atol=1e-5, rtol=1.3e-6)
        assert verdict["status"] == "close" and verdict["approximate"] is True
        assert verdict["required_atol"] == 0.0 and verdict["required_rtol"] == 0.0
    assert compare_stats(a, b, atol=1e-5, rtol=1.3e-6)["max_abs_err"] > 0  # the raw difference is still shown


def test_a_change_beyond_the_rounding_diverges() -> None:
    verdict = compare_stats(standard(X), native(X * 1.001), atol=1e-5, rtol=1.3e-6)
    assert verdict["status"] == "diverged" and verdict["within_tolerance"] is False
    assert verdict["reason"].startswith("compared on statistics only: mean ")
    assert 0 < verdict["required_rtol"] < 1.1e-3


def test_exact_statistics_get_no_rounding_allowance() -> None:
    verdict = compare_stats(native(X), native(X * (1 + 1e-5)), atol=0.0, rtol=1e-6)
    assert verdict["status"] == "diverged"  # a 5e-5 allowance, as for five-digit strings, would pass it
    assert 5e-6 < verdict["required_rtol"] < 5e-5


def test_an_overflowed_moment_is_not_compared() -> None:
    """A float32 mask holding finfo.min: transformers' std overflows to inf, the data is finite."""
    mask = torch.zeros(1, 1, 6, 6)
    mask[..., 3:] = torch.finfo(torch.float32).min
    a = standard(mask)
    assert a.stats["std"] == math.inf and math.isfinite(a.stats["min"])
    verdict = compare_stats(a, native(mask), atol=1e-5, rtol=1.3e-6)
    assert verdict["status"] == "close", verdict["reason"]


def test_an_infinite_statistic_against_a_finite_one_diverges() -> None:
    y = X.clone()
    y[0, 0] = math.inf
    verdict = compare_stats(native(y), native(X), atol=1e9, rtol=1e9)
    assert verdict["status"] == "diverged"
    assert "Inf count 1 vs 0" in verdict["reason"] and verdict["required_atol"] == math.inf
    verdict = compare_stats(standard(y), standard(X), atol=1e9, rtol=1e9)  # no counts: the max tells
    assert verdict["status"] == "diverged" and verdict["reason"].startswith("compared on statistics only: mean inf")


def test_nan_counts_are_compared_when_both_sides_recorded_them() -> None:
    y = X.clone()
    y[1, 1] = math.nan
    verdict = compare_stats(native(X), native(y), atol=1e9, rtol=1e9)
    assert verdict["status"] == "diverged" and "NaN count 0 vs 1" in verdict["reason"]
    assert verdict["nan_mismatch"] == 1


def test_no_common_statistics_is_no_data() -> None:
    ids = torch.arange(6)
    bare = TensorRecord(slot="inputs.args.0", order=0, shape=(6,), dtype="torch.int64", stats={})
    verdict = compare_stats(bare, native(ids), atol=0, rtol=0)
    assert (verdict["status"], verdict["within_tolerance"]) == ("no_data", None)
    assert verdict["reason"] == "no payload and no statistics in A"
