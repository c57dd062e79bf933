"""Differences that are not divergences, and exact comparisons where rounding would hide one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff
from tracediff.compare.benign import prepare_pair, squeezable
from tracediff.compare.payloads import _compare_exact

F32_MIN, BF16_MIN = torch.finfo(torch.float32).min, torch.finfo(torch.bfloat16).min


class Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Holder(nn.Module):
    """Passes its input through one child, so the tensor is recorded as an input and an output."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def captured(tmp_path: Path, name: str, value: torch.Tensor) -> Path:
    model = Holder()
    with tracediff.capture(model, tmp_path / name):
        model(value)
    return tmp_path / name


def test_int64_values_beyond_float32_precision_are_compared_exactly(tmp_path: Path) -> None:
    a = captured(tmp_path, "a", torch.tensor([2**40, 7]))
    b = captured(tmp_path, "b", torch.tensor([2**40 + 1, 7]))

    result = tracediff.align(a, b)

    assert not result.passed
    row = result.first_divergence
    assert row is not None and row.max_abs_err == 1.0 and row.mismatch_fraction == 0.5


def test_int64_values_beyond_float64_precision_are_compared_exactly() -> None:
    metrics = _compare_exact(torch.tensor([2**60]), torch.tensor([2**60 + 1]))

    assert (metrics.mismatched, metrics.max_abs_err, metrics.within_tolerance) == (1, 1.0, False)


def test_bools_and_integers_ignore_the_tolerance(tmp_path: Path) -> None:
    a = captured(tmp_path, "a", torch.tensor([True, False]))
    b = captured(tmp_path, "b", torch.tensor([True, True]))

    result = tracediff.align(a, b, atol=10.0, rtol=10.0)

    assert not result.passed


def test_complex_numbers_are_compared_on_both_parts(tmp_path: Path) -> None:
    a = captured(tmp_path, "a", torch.tensor([1 + 1j, 2 - 1j], dtype=torch.complex64))
    b = captured(tmp_path, "b", torch.tensor([1 + 2j, 2 - 1j], dtype=torch.complex64))

    result = tracediff.align(a, b)

    row = result.first_divergence
    assert row is not None and row.max_abs_err == 1.0
    assert "complex: compared on real and imaginary parts" in row.reason


def test_saturated_mask_values_compare_equal_across_dtypes(tmp_path: Path) -> None:
    """An additive attention mask: fp32's most negative value against bf16's, or against -inf."""
    a = captured(tmp_path, "a", torch.tensor([[0.0, F32_MIN, F32_MIN, 0.5]]))
    b = captured(tmp_path, "b", torch.tensor([[0.0, BF16_MIN, float("-inf"), 0.5]], dtype=torch.bfloat16))

    result = tracediff.align(a, b)

    assert result.passed
    row = result.rows[0]
    assert row.max_abs_err == 0.0
    assert "2 saturated values (at their dtype's finite extreme on both sides) treated as equal" in row.reason


def test_a_saturated_value_against_a_finite_one_still_diverges() -> None:
    a, b, notes, _ = prepare_pair(torch.tensor([F32_MIN, 1.0]), torch.tensor([-1.0, 1.0]))

    assert notes == [] and b.values.tolist() == [-1.0, 1.0]


@pytest.mark.parametrize("shape_a,shape_b,expected", [
    ((32,), (1, 32), True), ((1, 32, 1), (32,), True), ((32,), (32,), False), ((2, 16), (32,), False),
])
def test_shapes_that_differ_only_by_singleton_dimensions_are_squeezable(
        shape_a: tuple[int, ...], shape_b: tuple[int, ...], expected: bool) -> None:
    assert squeezable(shape_a, shape_b) is expected


def test_a_squeezed_pair_is_compared_and_says_so() -> None:
    a, b, notes, _ = prepare_pair(torch.arange(4.0), torch.arange(4.0).reshape(1, 4))

    assert a.shape == b.shape == (4,)
    assert notes == ["compared after squeezing singleton dimensions: [4] vs [1, 4]"]


def test_position_ids_of_shape_t_and_1_t_are_no_divergence(tmp_path: Path) -> None:
    a = captured(tmp_path, "a", torch.arange(8))
    b = captured(tmp_path, "b", torch.arange(8).reshape(1, 8))

    result = tracediff.align(a, b)

    assert result.passed and not result.sources


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_saturation_is_settled_without_float8_kernels(dtype: torch.dtype) -> None:
    low = torch.finfo(dtype).min
    a = torch.tensor([0.0, F32_MIN, 1.0])
    b = torch.tensor([0.0, low, 1.0]).to(dtype)

    _, settled, notes, _ = prepare_pair(a, b)

    assert settled.values.tolist() == [0.0, F32_MIN, 1.0]
    assert notes == ["1 saturated values (at their dtype's finite extreme on both sides) treated as equal"]
