"""Metric numerics over the whole float range: subnormal to huge values never under- or overflow.

Invariants that hold for every pair, checked as hypothesis properties on
values drawn from float64's and float32's full finite range, and the shrunk
failures kept as named cases.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.rounding import cosine_error, mean_error, unit_of
from tracediff.compare import metrics
from tracediff.compare.metrics import compare_tensors
from tracediff.compare.scaled import ScaledSum, scale_down

F64 = torch.float64
WIDE = settings(max_examples=60, deadline=None)


@st.composite
def wide_pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """Two tensors of one shape and dtype, values anywhere in the finite range (subnormals included)."""
    width = draw(st.sampled_from([64, 32]))
    dtype = F64 if width == 64 else torch.float32
    n = draw(st.integers(1, 12))
    values = st.floats(allow_nan=False, allow_infinity=False, width=width)
    a = draw(st.lists(values, min_size=n, max_size=n))
    b = draw(st.lists(values | st.sampled_from(a), min_size=n, max_size=n))
    return torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype)


def test_a_subnormal_against_zero_is_not_identical() -> None:
    """The failure a fresh clone found: squares underflowed to 0, so cosine was 1 and rms 0."""
    a, b = torch.tensor([0.0]), torch.tensor([4.6722e-308], dtype=F64)
    got = compare_tensors(a, b, atol=0, rtol=0)
    assert got.cosine == 0.0  # zero against non-zero
    assert got.mean_abs_err == got.rms_err == got.max_abs_err == 4.6722e-308
    assert metrics.cosine(a, b) == 0.0 and metrics.rms_err(a, b) == 4.6722e-308


def test_cosine_of_opposite_tiny_vectors_is_minus_one() -> None:
    a, b = torch.tensor([1e-200], dtype=F64), torch.tensor([-1e-200], dtype=F64)
    assert metrics.cosine(a, b) == -1.0
    assert compare_tensors(a, b, atol=0, rtol=0).cosine == -1.0


@pytest.mark.parametrize("value", [5e-324, 1e-310, 1e-200, 1e200, 1e308])
def test_extreme_magnitudes_keep_every_metric_exact(value: float) -> None:
    a = torch.tensor([value, -value, value], dtype=F64)
    b = torch.tensor([value, -value, value / 2], dtype=F64) if value > 1e-320 else torch.zeros(3, dtype=F64)
    got = compare_tensors(a, b, atol=0, rtol=0)
    diff = (a - b).abs()
    assert got.max_abs_err == float(diff.max())
    assert got.mean_abs_err == pytest.approx(float(diff.max()) / 3, rel=1e-12)
    assert got.rms_err == pytest.approx(float(diff.max()) / math.sqrt(3), rel=1e-12)
    assert math.isfinite(got.cosine) and -1 <= got.cosine <= 1
    assert metrics.mean_abs_err(a, b) == pytest.approx(got.mean_abs_err, rel=1e-12)
    assert metrics.rms_err(a, b) == pytest.approx(got.rms_err, rel=1e-12)
    assert metrics.cosine(a, b) == pytest.approx(got.cosine, abs=1e-12)


def test_cosine_is_one_for_two_zero_vectors_and_zero_for_one() -> None:
    z, x = torch.zeros(4, dtype=F64), torch.full((4,), 1e-320, dtype=F64)
    assert compare_tensors(z, z.clone(), atol=0, rtol=0).cosine == 1.0
    assert compare_tensors(z, -z, atol=0, rtol=0).cosine == 1.0  # -0.0 is zero too
    assert compare_tensors(z, x, atol=0, rtol=0).cosine == 0.0
    assert compare_tensors(x, z, atol=0, rtol=0).cosine == 0.0
    assert metrics.cosine(z, -z) == 1.0 and metrics.cosine(z, x) == 0.0 and metrics.cosine(x, z) == 0.0


def test_float32_squares_below_its_range_are_summed_scaled() -> None:
    a = torch.tensor([1e-30, 0.0, 3e-31])
    b = torch.tensor([0.0, 1e-30, 3e-31])
    got = compare_tensors(a, b, atol=0, rtol=0)
    assert got.cosine == pytest.approx(0.09 / 1.09, rel=1e-5)  # 9e-62 / (1e-60 + 9e-62)
    assert got.rms_err == pytest.approx(math.sqrt(2e-60 / 3), rel=1e-6)


def test_a_difference_beyond_float64_is_infinite_everywhere() -> None:
    a, b = torch.tensor([1e308], dtype=F64), torch.tensor([-1e308], dtype=F64)
    got = compare_tensors(a, b, atol=0, rtol=0)
    assert got.max_abs_err == got.mean_abs_err == got.rms_err == got.required_atol == math.inf
    assert got.cosine == -1.0


def test_scaled_sum_keeps_totals_beyond_float_range() -> None:
    total = ScaledSum()
    total.add(1.5, 2000)
    total.add(0.5, 2001)
    assert (total.value, total.exp) == (1.25, 2001) and float(total) == math.inf
    small = ScaledSum()
    small.add(1.0, -1100)
    assert float(small) == 0.0 and not small.is_zero
    assert float(scale_down(torch.tensor([5e-324], dtype=F64), -1073)) == 0.5  # 2**-1074 * 2**1073


@WIDE
@given(wide_pairs())
@example((torch.tensor([0.0], dtype=F64), torch.tensor([4.6722e-308], dtype=F64)))
@example((torch.tensor([1e-200], dtype=F64), torch.tensor([-1e-200], dtype=F64)))
@example((torch.tensor([1e308, -1e308], dtype=F64), torch.tensor([1e308, 1e308], dtype=F64)))
@example((torch.tensor([3672822.0]), torch.tensor([1.0])))  # float32 sum of squares rounded above max^2
def test_rms_err_is_at_least_mean_abs_err(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    a, b = pair
    got = compare_tensors(a, b, atol=0, rtol=0)
    assert got.max_abs_err >= got.rms_err >= got.mean_abs_err
    assert metrics.rms_err(a, b) >= metrics.mean_abs_err(a, b) * (1 - 1e-12)


@WIDE
@given(wide_pairs())
@example((torch.tensor([1e-200], dtype=F64), torch.tensor([-1e-200], dtype=F64)))
@example((torch.tensor([1e300, 1e300], dtype=F64), torch.tensor([1e300, -1e300], dtype=F64)))
def test_cosine_is_within_minus_one_and_one(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    a, b = pair
    for value in (compare_tensors(a, b, atol=0, rtol=0).cosine, metrics.cosine(a, b)):
        assert -1.0 <= value <= 1.0
    assert compare_tensors(a, a.clone() * 1, atol=0, rtol=0).cosine == 1.0  # bitwise-identical fast path


@WIDE
@given(wide_pairs())
@example((torch.tensor([0.0]), torch.tensor([1e-45])))
@example((torch.tensor([0.0], dtype=F64), torch.tensor([4.6722e-308], dtype=F64)))
def test_required_atol_is_exact(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    """The reported atol passes (rtol=0) and the next float below it fails."""
    a, b = pair
    required = compare_tensors(a, b, atol=0, rtol=0).required_atol
    assert compare_tensors(a, b, atol=required, rtol=0).mismatched == 0
    if required > 0:
        assert compare_tensors(a, b, atol=math.nextafter(required, 0.0), rtol=0).mismatched > 0


@WIDE
@given(wide_pairs(), st.integers(1, 5))
def test_chunked_sums_agree_with_one_pass(pair: tuple[torch.Tensor, torch.Tensor], chunk: int) -> None:
    a, b = pair
    whole = compare_tensors(a, b, atol=0, rtol=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metrics, "CHUNK", chunk)
        chunked = compare_tensors(a, b, atol=0, rtol=0)
    assert chunked.max_abs_err == whole.max_abs_err  # settled in float64: no order in a maximum
    # the same products summed in another grouping, each within its bound of the exact value (tests/rounding.py)
    n, u = a.numel(), unit_of(str(a.dtype), str(b.dtype))
    for key in ("mean_abs_err", "rms_err"):
        assert getattr(chunked, key) == pytest.approx(getattr(whole, key), rel=2 * mean_error(n, u), abs=0), key
    assert abs(chunked.cosine - whole.cosine) <= 2 * cosine_error(n, u, whole.cosine)
