"""Numeric statistics of recorded tensors, checked against numpy, and their string forms."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

import tracediff
from tests.capturing.helpers import payload, trace_json
from tests.models import EmitAll
from tracediff.capturing.stats import format_scalar, tensor_stats

FLOAT8 = [getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)]
FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64, *FLOAT8]
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
EPS = {torch.float64: 2.0**-52}  # everything else is measured in float32


def reference(t: torch.Tensor) -> dict[str, Any]:
    """The statistics by their definition, in float64 numpy; moments over the finite elements."""
    n = t.numel()
    if n == 0:
        return {"numel": 0}
    if not t.is_floating_point():
        a = t.to(torch.int64).numpy()
        return {"numel": n, "min": int(a.min()), "max": int(a.max()), "zeros": int((a == 0).sum())}
    a = t.double().numpy().reshape(-1)
    finite = a[np.isfinite(a)]
    nan, posinf, neginf = int(np.isnan(a).sum()), int((a == np.inf).sum()), int((a == -np.inf).sum())
    non_nan = a[~np.isnan(a)]  # min and max are the extreme non-NaN elements, infinities included
    lo = float(non_nan.min()) if non_nan.size else math.nan
    hi = float(non_nan.max()) if non_nan.size else math.nan
    return {
        "numel": n, "min": lo, "max": hi, "nan": nan, "posinf": posinf, "neginf": neginf,
        "zeros": int((a == 0).sum()),
        "mean": float(finite.mean()) if finite.size else math.nan,
        "std": float(finite.std(ddof=1)) if finite.size > 1 else math.nan,
        "abs_mean": float(np.abs(finite).mean()) if finite.size else math.nan,
    }


def assert_stats(t: torch.Tensor, *, check_zeros: bool = True) -> None:
    got, want = tensor_stats(t), reference(t)
    assert set(got) == set(want)
    exact = ["numel", "min", "max", "nan", "posinf", "neginf"] + (["zeros"] if check_zeros else [])
    for key in exact:
        if key in want:
            assert got[key] == want[key] or (math.isnan(got[key]) and math.isnan(want[key])), key
    if "mean" not in want:
        return
    finite = t.double()[torch.isfinite(t.double())]
    m = finite.numel()
    # Worst-case rounding of m-term sums in the working precision, relative to the data's scale.
    rms = float(finite.square().mean().sqrt()) if m else 0.0
    eps = EPS.get(t.dtype, 2.0**-23)
    for key in ("mean", "abs_mean", "std"):
        g, w = got[key], want[key]
        if math.isnan(w):
            assert math.isnan(g), key
            continue
        bound = math.sqrt(2 * m * eps) * rms if key == "std" else 2 * m * eps * rms
        assert abs(g - w) <= bound + 1e-300, (key, g, w, bound)


# Magnitudes where every float dtype under test keeps its precision (huge and tiny values have their own tests).
finite_floats = st.one_of(st.just(0.0), st.floats(2.0**-20, 1e4, width=32), st.floats(-1e4, -(2.0**-20), width=32))
shapes = array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=9)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@settings(max_examples=40, deadline=None)
@given(values=arrays(np.float32, shapes, elements=finite_floats))
def test_float_stats_match_numpy(dtype: torch.dtype, values: np.ndarray) -> None:
    t = torch.from_numpy(values).to(dtype)
    if dtype in FLOAT8 and not torch.isfinite(t.float()).all():
        return  # values out of float8 range became inf/nan, covered by the non-finite test
    assert_stats(t)


@settings(max_examples=60, deadline=None)
@given(values=arrays(np.float32, shapes, elements=finite_floats | st.sampled_from([math.nan, math.inf, -math.inf])))
def test_non_finite_counts_and_finite_moments(values: np.ndarray) -> None:
    t = torch.from_numpy(values)
    assert_stats(t, check_zeros=not torch.isnan(t).any())


@pytest.mark.parametrize("values", [[math.inf], [-math.inf, math.nan], [math.nan, math.nan], [math.inf, -math.inf]])
def test_min_and_max_are_elements_even_without_finite_ones(values: list[float]) -> None:
    t = torch.tensor(values)
    assert_stats(t, check_zeros=False)
    stats = tensor_stats(t)
    assert math.isnan(stats["mean"]) and math.isnan(stats["std"]) and math.isnan(stats["abs_mean"])


def test_zero_count_with_nan_present() -> None:
    assert tensor_stats(torch.tensor([math.nan, 0.0, 1.0]))["zeros"] == 1


def test_std_of_large_float32_values() -> None:
    assert tensor_stats(torch.tensor([1e20, 3e20]))["std"] == pytest.approx(math.sqrt(2) * 1e20, rel=1e-6)


def test_std_of_tiny_float32_values() -> None:
    std = tensor_stats(torch.tensor([1e-24, 3e-24]))["std"]
    assert std == pytest.approx(math.sqrt(2) * 1e-24, rel=1e-6, abs=0)


@pytest.mark.parametrize("dtype", INTS, ids=str)
@settings(max_examples=25, deadline=None)
@given(values=arrays(np.int64, shapes, elements=st.integers(0, 100)))
def test_integer_stats_match_numpy(dtype: torch.dtype, values: np.ndarray) -> None:
    t = torch.from_numpy(values).to(dtype)
    if dtype != torch.uint8:
        t = t - 50
    assert_stats(t)
    assert set(tensor_stats(t)) == {"numel", "min", "max", "zeros"}


@settings(max_examples=25, deadline=None)
@given(values=arrays(np.bool_, shapes))
def test_bool_stats_match_numpy(values: np.ndarray) -> None:
    t = torch.from_numpy(values)
    assert tensor_stats(t) == reference(t)


def test_known_values() -> None:
    stats = tensor_stats(torch.tensor([[1.0, -2.0], [3.0, 0.0]]))
    assert stats == {"numel": 4, "min": -2.0, "max": 3.0, "nan": 0, "posinf": 0, "neginf": 0, "zeros": 1,
                     "mean": 0.5, "std": pytest.approx(math.sqrt(13 / 3), rel=1e-12), "abs_mean": 1.5}
    assert tensor_stats(torch.zeros(0, 3)) == {"numel": 0}
    one = tensor_stats(torch.tensor([7.0]))
    assert one["mean"] == 7.0 and math.isnan(one["std"])
    only_nan = tensor_stats(torch.tensor([math.nan, math.nan]))
    assert only_nan["nan"] == 2 and all(math.isnan(only_nan[k]) for k in ("mean", "std", "min", "max"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@settings(max_examples=40, deadline=None)
@given(value=st.floats(width=32))
def test_string_fields_read_like_torch_scalars_in_sci_mode(dtype: torch.dtype, value: float) -> None:
    scalar = torch.tensor(value, dtype=dtype)
    assume(not (scalar == 0 and scalar.signbit()))  # -0.0: see test_string_field_of_negative_zero
    torch.set_printoptions(sci_mode=True)
    try:
        expected = repr(scalar)
    finally:
        torch.set_printoptions(profile="default")
    assert format_scalar(float(scalar), dtype) == expected


def test_string_field_of_negative_zero() -> None:
    assert format_scalar(-0.0, torch.float32) == "tensor(-0.)"


def test_unsigned_wide_integer_stats() -> None:
    assert tensor_stats(torch.tensor([0, 7], dtype=torch.uint16)) == {"numel": 2, "min": 0, "max": 7, "zeros": 1}


def test_capture_records_stats_for_every_dtype(tmp_path: Path) -> None:
    torch.manual_seed(0)
    values = [torch.randn(3, 5).to(dtype) for dtype in FLOATS]
    values += [torch.randint(-5, 6, (4, 3)).to(dtype) for dtype in INTS if dtype != torch.uint8]
    values += [torch.randint(0, 6, (4,), dtype=torch.uint8), torch.tensor([True, False, False]),
               torch.tensor([1.0, math.nan, math.inf, -math.inf, 0.0, -0.0]), torch.zeros(0)]
    model = EmitAll(values)
    with tracediff.capture(model, tmp_path) as session:
        model(torch.ones(1))
    assert session.complete
    outputs = trace_json(tmp_path)["outputs"]
    assert len(outputs) == len(values)
    for entry, value in zip(outputs, values):
        stored = payload(tmp_path, entry)
        assert stored.dtype == value.dtype and torch.equal(stored.view(-1).view(torch.uint8),
                                                           value.reshape(-1).view(torch.uint8))
        assert entry["dtype"] == repr(value.dtype) and entry["shape"] == repr(value.shape)
        assert entry["stats"] == pytest.approx(tensor_stats(value), rel=0, abs=0, nan_ok=True)
        if value.is_floating_point() and value.numel():
            assert [entry[k] for k in ("mean", "std", "min", "max")] == [
                format_scalar(entry["stats"][k], value.dtype) for k in ("mean", "std", "min", "max")]
        else:
            assert "mean" not in entry
    special = outputs[-2]["stats"]
    assert (special["nan"], special["posinf"], special["neginf"]) == (1, 1, 1)
    assert (special["min"], special["max"]) == (-math.inf, math.inf)
