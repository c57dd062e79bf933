"""Statistics against plain-Python reference formulas (math.fsum, sorted), property-tested."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tracediff.steps.stat_names import NUMERIC_STATS
from tracediff.steps.tensor_stats import tensor_stats


def reference(values: list[float]) -> dict[str, float | int]:
    """The module docstring's definitions, written with the standard library only."""
    finite = [v for v in values if math.isfinite(v)]
    m = len(finite)
    non_nan = [v for v in values if not math.isnan(v)]
    out: dict[str, float | int] = {
        "nan": sum(math.isnan(v) for v in values),
        "posinf": sum(v == math.inf for v in values),
        "neginf": sum(v == -math.inf for v in values),
        "zeros": sum(v == 0 for v in values),
        "min": min(non_nan) if non_nan else math.nan,
        "max": max(non_nan) if non_nan else math.nan,
    }
    if m == 0:
        return out | dict.fromkeys(NUMERIC_STATS[6:], math.nan)
    mean = math.fsum(finite) / m
    d = [v - mean for v in finite]
    m2 = math.fsum(x * x for x in d) / m
    var_unbiased = math.fsum(x * x for x in d) / (m - 1) if m > 1 else math.nan
    counts = Counter(finite)
    top = max(counts.values())
    out.update(
        mean=mean,
        abs_mean=math.fsum(abs(v) for v in finite) / m,
        var_biased=m2,
        var_unbiased=var_unbiased,
        std=math.sqrt(var_unbiased),
        skewness=(math.fsum(x**3 for x in d) / m) / m2**1.5 if m2 > 0 else math.nan,
        kurtosis=(math.fsum(x**4 for x in d) / m) / m2**2 - 3 if m2 > 0 else math.nan,
        median=sorted(finite)[(m - 1) // 2],
        mode=min(v for v, c in counts.items() if c == top),
    )
    return out


def assert_matches(got: dict[str, float | int], want: dict[str, float | int], magnitude: float) -> None:
    """Exact counts; float64 rounding allowed relative to the data's ``magnitude`` (max |value|).

    The variance comes from one-pass sums (see the module docstring): its absolute error is bounded
    by about 1e-16 * n * magnitude**2, and the error of its square root by the square root of that.
    """
    var_error = 1e-13 * magnitude**2
    assert list(got) == list(NUMERIC_STATS)
    for name in NUMERIC_STATS:
        g, w = got[name], want[name]
        if name in ("nan", "posinf", "neginf", "zeros"):
            assert g == w, name
        elif math.isnan(w):
            assert math.isnan(g), name
        elif name in ("skewness", "kurtosis"):  # scale-free, second pass in float64 (see _SHAPE_BOUND)
            assert g == pytest.approx(w, rel=1e-6, abs=1e-6), name
        elif name.startswith("var"):
            assert g == pytest.approx(w, rel=1e-12, abs=var_error), name
        elif name == "std":
            assert g == pytest.approx(w, rel=1e-12, abs=math.sqrt(var_error)), name
        else:
            assert g == pytest.approx(w, rel=1e-12, abs=1e-12 * magnitude), name


# _SHAPE_BOUND: why 1e-6 (absolute) holds for skewness and kurtosis on any CPU. The data below has m <= 40 finite
# values with |v| <= M, and var >= 1e-12 M**2 (nearer-constant data is set aside), so sigma = sqrt(m2) >= 1e-6 M.
# Both sides work in float64 (u = 2**-53) on the same values. tensor_stats' mean is a float64 sum in some order,
# within gamma_40 * M of the exact one, and fsum's within u * M: the two means differ by e < 5e-15 M. A mean off
# by e shifts every deviation d by e; as sum(d) = 0, sum(d**3)/m moves by about 3 e sigma**2 and sum(d**4)/m by
# about 4 e sum|d|**3/m <= 4 e sqrt(m) sigma**3 (sum|d|**k <= (sum d**2)**(k/2) = (m sigma**2)**(k/2)). So the
# skewness moves by at most 3 e / sigma < 1.5e-8 and the kurtosis by 4 sqrt(m) e / sigma < 1.3e-7. The sums of
# d**3 and d**4 themselves (m terms, two roundings each, any order) are within gamma_42 * sum|d|**k: at most
# gamma_42 * sqrt(m) < 3e-14 on the skewness and gamma_42 * m < 2e-13 on the kurtosis. In all, < 2e-7.
_floats = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False, width=32)
_specials = st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(_floats, _floats, _floats, _specials), min_size=0, max_size=40))
def test_float32_statistics_match_the_reference(values: list[float]) -> None:
    got = tensor_stats(torch.tensor(values, dtype=torch.float32), NUMERIC_STATS)
    as_stored = torch.tensor(values, dtype=torch.float32).double().tolist()
    finite = [abs(v) for v in as_stored if math.isfinite(v)]
    want = reference(as_stored)
    if finite and want["var_biased"] < 1e-12 * max(finite) ** 2:
        # near-constant data: skewness and kurtosis are rounding noise in float64, whoever computes them
        got = got | {"skewness": math.nan, "kurtosis": math.nan}
        want = want | {"skewness": math.nan, "kurtosis": math.nan}
    assert_matches(got, want, magnitude=max(finite, default=1.0))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=-1000, max_value=1000), min_size=1, max_size=30))
def test_integer_statistics_match_the_reference(values: list[int]) -> None:
    got = tensor_stats(torch.tensor(values, dtype=torch.int64), NUMERIC_STATS)
    assert_matches(got, reference([float(v) for v in values]), magnitude=1000.0)


@settings(max_examples=30, deadline=None)
@given(st.lists(_floats, min_size=1, max_size=30))
def test_bfloat16_statistics_measure_the_stored_values(values: list[float]) -> None:
    t = torch.tensor(values).to(torch.bfloat16)
    got = tensor_stats(t, ("min", "max", "mean", "median"))
    want = reference(t.double().tolist())
    assert list(got) == ["min", "max", "mean", "median"]
    for name in got:
        assert got[name] == pytest.approx(want[name], rel=1e-12, abs=1e-9), name


def test_only_requested_statistics_are_computed_and_complex_gets_none() -> None:
    t = torch.tensor([[1.0, 2.0], [2.0, 5.0]])
    assert tensor_stats(t, {"max", "mode", "shape", "hash"}) == {"max": 5.0, "mode": 2.0}
    assert tensor_stats(t, ()) == {}
    assert tensor_stats(torch.ones(3, dtype=torch.complex64), NUMERIC_STATS) == {}


def test_bool_tensor_counts_false_as_zero() -> None:
    got = tensor_stats(torch.tensor([True, False, False]), ("zeros", "mean", "mode"))
    assert got == {"zeros": 2, "mean": pytest.approx(1 / 3), "mode": 0.0}
