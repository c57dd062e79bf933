"""The relative error ``rms(b - a) / rms(a)``: one formula, one rule for NaN, infinities and zero references.

Each clause of the rule in :mod:`tracediff.compare.relative` has its test; hypothesis checks the formula
against a direct numpy computation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tracediff.compare.relative import SquareSums, relative_mse, relative_of, relative_rms, square_sums

# moderate magnitudes: the float64 sums of squares neither under- nor overflow
_VALUES = st.floats(min_value=-1e6, max_value=1e6) | st.sampled_from([math.nan, math.inf, -math.inf, 0.0])


def numpy_reference(a: np.ndarray, b: np.ndarray) -> float:
    """``sqrt(sum (b - a)^2 / sum a^2)`` over the positions where both are finite, written out with numpy."""
    keep = np.isfinite(a) & np.isfinite(b)
    err, ref = np.sum((b[keep] - a[keep]) ** 2), np.sum(a[keep] ** 2)
    if ref == 0:
        return 0.0 if err == 0 else math.inf
    return float(np.sqrt(err / ref))


@st.composite
def pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(min_value=0, max_value=40))
    a = draw(hnp.arrays(np.float64, n, elements=_VALUES))
    b = draw(hnp.arrays(np.float64, n, elements=_VALUES))
    return a, b


@given(pairs())
@example((np.array([3.0, 4.0]), np.array([3.0, 4.5])))
@example((np.array([0.0, 0.0]), np.array([0.0, 1e-300])))  # a zero reference against a tiny difference
@example((np.array([np.nan, 2.0]), np.array([1.0, np.inf])))  # nothing finite on both sides
def test_it_is_the_numpy_formula_over_the_finite_positions(pair: tuple[np.ndarray, np.ndarray]) -> None:
    a, b = pair
    expected = numpy_reference(a, b)
    got = relative_rms(a, b)
    if math.isinf(expected):
        assert got == math.inf
    else:
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-300)
    assert relative_mse(a, b) == pytest.approx(got * got, rel=1e-12, abs=1e-300) or math.isinf(got)


def test_a_nan_on_either_side_leaves_its_position_out() -> None:
    a, b = np.array([1.0, np.nan, 2.0]), np.array([1.5, 7.0, np.nan])
    assert relative_rms(a, b) == pytest.approx(0.5)  # only position 0: |0.5| / |1|
    assert square_sums(a, b) == SquareSums(error=0.25, reference=1.0, count=1)


def test_an_infinity_on_either_side_leaves_its_position_out() -> None:
    a, b = np.array([np.inf, 2.0, -np.inf]), np.array([np.inf, 3.0, 5.0])
    assert relative_rms(a, b) == pytest.approx(0.5)


def test_a_zero_reference_gives_zero_when_b_is_zero_too_and_inf_otherwise() -> None:
    assert relative_rms(np.zeros(3), np.zeros(3)) == 0.0
    assert relative_rms(np.zeros(3), np.array([0.0, 1e-30, 0.0])) == math.inf


def test_nothing_finite_on_both_sides_gives_zero() -> None:
    assert relative_rms(np.array([np.nan, 1.0]), np.array([1.0, np.nan])) == 0.0
    assert relative_rms(np.array([]), np.array([])) == 0.0


def test_pooled_tensors_are_the_tensors_laid_end_to_end() -> None:
    a1, b1 = np.array([1.0, 2.0]), np.array([1.1, 2.0])
    a2, b2 = np.array([[10.0], [0.0]]), np.array([[9.0], [np.nan]])
    pooled = square_sums(a1, b1) + square_sums(a2, b2)
    flat = relative_rms(np.concatenate([a1, a2.reshape(-1)]), np.concatenate([b1, b2.reshape(-1)]))
    assert pooled.relative_rms == pytest.approx(flat, rel=1e-15) and pooled.count == 3
    assert pooled.rms_err == pytest.approx(math.sqrt((0.1 ** 2 + 1.0) / 3))


def test_the_ratio_of_two_rms_values_follows_the_same_rule() -> None:
    assert relative_of(0.5, 2.0) == 0.25
    assert relative_of(0.0, 0.0) == 0.0 and relative_of(1e-9, 0.0) == math.inf
    assert math.isnan(relative_of(math.nan, 1.0)) and math.isnan(relative_of(1.0, math.nan))


def test_bfloat16_and_torch_tensors_are_read_exactly() -> None:
    a = torch.tensor([1.0, 2.0, 4.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 2.0, 4.03125], dtype=torch.bfloat16)  # 4 + one bfloat16 ulp
    assert relative_rms(a, b) == pytest.approx(0.03125 / math.sqrt(21.0), rel=1e-15)
    assert relative_rms(a.float(), b.double()) == relative_rms(a, b)


def test_tensors_of_different_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="different sizes: 2 and 3"):
        relative_rms(np.zeros(2), np.zeros(3))
