"""The metrics of ``tracediff.compare.metrics`` against numpy references written from its docstring.

Every reference below is the docstring's definition, computed in float64
over the values both tensors hold (after rounding to their dtypes). Sums of
squares and dot products run on values divided by a power of two near the
largest magnitude (as BLAS nrm2 does), so subnormal and huge values neither
underflow nor overflow in the reference either.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from tests.rounding import U32, U64, cosine_error, mean_error, unit_of
from tracediff.compare import metrics
from tracediff.compare.metrics import METRICS, compare_tensors

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0]
TOLERANCES = st.sampled_from([0.0, 1e-8, 1e-5, 1e-3, 0.1, 1.0]) | st.floats(0, 2, allow_nan=False)


# --- references ---------------------------------------------------------------------------------------------


def scaled(v: np.ndarray) -> tuple[np.ndarray, int]:
    """``v / 2**k`` with ``2**k`` near ``max |v|`` (exact: a power of two), and ``k``."""
    top = float(np.max(np.abs(v))) if v.size else 0.0
    k = math.frexp(top)[1] if top and math.isfinite(top) else 0
    return np.ldexp(v, -k), k


def ref_metrics(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> dict[str, float]:
    x = a.double().reshape(-1).numpy()
    y = b.double().reshape(-1).numpy()
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        finite = np.isfinite(x) & np.isfinite(y)
        fx, fy = x[finite], y[finite]
        d = np.abs(fx - fy)
        nonempty = d.size > 0
        rel = np.where(fx == 0, np.where(d == 0, 0.0, np.inf), d / np.abs(fx))
        (sx, _), (sy, _), (sd, kd) = scaled(fx), scaled(fy), scaled(d)
        nx, ny = float(np.sqrt(np.dot(sx, sx))), float(np.sqrt(np.dot(sy, sy)))
        if nx == 0 and ny == 0:
            cos = 1.0
        elif nx == 0 or ny == 0:
            cos = 0.0
        else:
            cos = max(-1.0, min(1.0, float(np.dot(sx, sy)) / (nx * ny)))
        nan_x, nan_y = np.isnan(x), np.isnan(y)
        inf_mismatch = int(np.sum(~nan_x & ~nan_y & (np.isinf(x) | np.isinf(y)) & (x != y)))
        both = np.isfinite(x) & np.isfinite(y)
        ok = both & (np.abs(x - y) <= atol + rtol * np.abs(x))
        ok |= (nan_x & nan_y) | (np.isinf(x) & (x == y))  # any other non-finite pair fails
    nonfinite = int(np.sum(nan_x ^ nan_y)) + inf_mismatch > 0
    max_abs = float(d.max()) if nonempty else 0.0
    max_rel = float(rel.max()) if nonempty else 0.0
    return {
        "max_abs_err": max_abs,
        "max_rel_err": max_rel,
        "mean_abs_err": math.ldexp(float(sd.mean()), kd) if nonempty else 0.0,
        "rms_err": math.ldexp(float(np.sqrt(np.mean(sd * sd))), kd) if nonempty else 0.0,
        "cosine": cos,
        "nan_mismatch": int(np.sum(nan_x ^ nan_y)),
        "inf_mismatch": inf_mismatch,
        "mismatched": int(np.sum(~ok)),
        "mismatch_fraction": float(np.sum(~ok)) / x.size if x.size else 0.0,
        "required_atol": math.inf if nonfinite else max_abs,
        "required_rtol": math.inf if nonfinite else max_rel,
    }


def _no_tiny_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """No nonzero magnitude near float32's subnormal range, where the float32 kernel rounds coarsely."""
    return all(v == 0 or abs(v) > 1e-15 for t in (a, b) for v in t.double().reshape(-1).tolist())


def mismatches(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> int:
    return compare_tensors(a, b, atol=atol, rtol=rtol).mismatched


# --- strategies ---------------------------------------------------------------------------------------------


@st.composite
def tensor_pairs(draw: st.DrawFn, *, same_dtype: bool = False, specials: bool = True) -> tuple[torch.Tensor, ...]:
    """Two tensors of one shape: b is a, a perturbed a, or unrelated, with NaN/Inf/zeros sprinkled in."""
    n = draw(st.integers(1, 48))
    dtype_a = draw(st.sampled_from(DTYPES))
    dtype_b = dtype_a if same_dtype else draw(st.sampled_from(DTYPES))
    values = st.floats(-1000, 1000, allow_nan=False, allow_subnormal=False)
    base = draw(st.lists(values, min_size=n, max_size=n))
    scale = draw(st.sampled_from([0.0, 1e-6, 1e-3, 0.1, 10.0]))
    noise = draw(st.lists(st.floats(-1, 1), min_size=n, max_size=n))
    other = [x + scale * e for x, e in zip(base, noise)]
    if draw(st.booleans()) and specials:
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, n - 1))
            side = draw(st.sampled_from(["a", "b", "both"]))
            value = draw(st.sampled_from(SPECIALS))
            if side in ("a", "both"):
                base[i] = value
            if side in ("b", "both"):
                other[i] = value if side == "b" or draw(st.booleans()) else draw(st.sampled_from(SPECIALS))
    shape = draw(st.sampled_from([(n,), (1, n), (n, 1)]))
    a = torch.tensor(base, dtype=torch.float64).to(dtype_a).reshape(shape)
    b = torch.tensor(other, dtype=torch.float64).to(dtype_b).reshape(shape)
    return a, b


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- compare_tensors against the references -----------------------------------------------------------------


def _approx(value: float, expected: float, rel: float) -> bool:
    if math.isinf(expected) or math.isnan(expected):
        return value == expected or (math.isnan(value) and math.isnan(expected))
    return value == pytest.approx(expected, rel=rel, abs=1e-12)


@SETTINGS
@given(tensor_pairs(), TOLERANCES, TOLERANCES)
@example(pair=(torch.tensor([0.0]), torch.tensor([4.6722e-308], dtype=torch.float64)), atol=0.0, rtol=0.0)
@example(pair=(torch.tensor([1e-200], dtype=torch.float64), torch.tensor([-1e-200], dtype=torch.float64)),
         atol=0.0, rtol=0.0)
def test_compare_tensors_matches_the_definitions(pair: tuple[torch.Tensor, torch.Tensor], atol: float,
                                                 rtol: float) -> None:
    a, b = pair
    got = compare_tensors(a, b, atol=atol, rtol=rtol)
    want = ref_metrics(a, b, atol, rtol)
    assert got.numel == a.numel()
    for key in ("max_abs_err", "max_rel_err"):  # one float64 subtraction (and quotient) per element, as the reference
        assert _approx(getattr(got, key), want[key], rel=4 * U64), key
    # sums of float32 products against the float64 reference: within their derived bounds on any CPU (and the
    # reference's own float64 rounding); abs=1e-12 (in _approx) only for float32's subnormal spacing (1.4e-45)
    n, u = a.numel(), unit_of(str(a.dtype), str(b.dtype))
    for key in ("mean_abs_err", "rms_err"):
        assert _approx(getattr(got, key), want[key], rel=mean_error(n, u) + mean_error(n, U64)), key
    assert abs(got.cosine - want["cosine"]) <= cosine_error(n, u, want["cosine"]) + cosine_error(n, U64, 1.0) \
        or math.isnan(want["cosine"])
    assert got.nan_mismatch == want["nan_mismatch"]
    assert got.inf_mismatch == want["inf_mismatch"]
    assert got.mismatched == want["mismatched"]
    assert got.mismatch_fraction == want["mismatch_fraction"]
    assert got.within_tolerance is (want["mismatched"] == 0)
    assert _approx(got.required_atol, want["required_atol"], rel=1e-6)
    assert _approx(got.required_rtol, want["required_rtol"], rel=1e-6)


@SETTINGS
@given(tensor_pairs(), TOLERANCES, TOLERANCES)
@example(pair=(torch.tensor([0.0]), torch.tensor([4.6722e-308], dtype=torch.float64)), atol=0.0, rtol=0.0)
@example(pair=(torch.tensor([1e-200], dtype=torch.float64), torch.tensor([-1e-200], dtype=torch.float64)),
         atol=0.0, rtol=0.0)
def test_single_metric_functions_match_the_definitions(pair: tuple[torch.Tensor, torch.Tensor], atol: float,
                                                       rtol: float) -> None:
    a, b = pair
    want = ref_metrics(a, b, atol, rtol)
    for name, fn in METRICS.items():
        assert _approx(float(fn(a, b)), float(want[name]), rel=1e-9), name
    assert metrics.mismatch_fraction(a, b, atol=atol, rtol=rtol) == want["mismatch_fraction"]


def test_reference_mismatch_fraction_fails_an_infinity_against_a_number() -> None:
    a, b = torch.tensor([math.inf, 0.0]), torch.tensor([0.0, 0.0])
    assert compare_tensors(a, b, atol=0.0, rtol=1e-8).mismatch_fraction == 0.5
    assert metrics.mismatch_fraction(a, b, atol=0.0, rtol=1e-8) == 0.5


@SETTINGS
@given(tensor_pairs(), st.integers(1, 7))
def test_streaming_over_small_chunks_gives_the_same_metrics(pair: tuple[torch.Tensor, torch.Tensor], chunk: int,
                                                            ) -> None:
    a, b = pair
    whole = compare_tensors(a, b, atol=1e-5, rtol=1e-3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metrics, "CHUNK", chunk)
        chunked = compare_tensors(a, b, atol=1e-5, rtol=1e-3)
    assert chunked.mismatched == whole.mismatched
    assert chunked.max_abs_err == whole.max_abs_err  # maxima are settled in float64: no order in them
    assert chunked.max_rel_err == whole.max_rel_err
    # the same products summed in another grouping: each within its bound of the exact value (tests/rounding.py)
    n, u = a.numel(), unit_of(str(a.dtype), str(b.dtype))
    assert chunked.mean_abs_err == pytest.approx(whole.mean_abs_err, rel=2 * mean_error(n, u), abs=1e-300)
    assert chunked.rms_err == pytest.approx(whole.rms_err, rel=2 * mean_error(n, u), abs=1e-300)
    assert abs(chunked.cosine - whole.cosine) <= 2 * cosine_error(n, u, whole.cosine)
    assert (chunked.nan_mismatch, chunked.inf_mismatch) == (whole.nan_mismatch, whole.inf_mismatch)


def test_a_tensor_larger_than_one_chunk() -> None:
    n = metrics.CHUNK + 1000
    a = torch.linspace(-3, 3, n)
    b = a.clone()
    b[-1] += 0.5  # the worst element sits in the last, partial chunk
    b[7] = math.nan
    got = compare_tensors(a, b, atol=1e-5, rtol=0)
    want = ref_metrics(a, b, 1e-5, 0)
    assert got.mismatched == want["mismatched"] == 2
    assert got.nan_mismatch == 1 and got.required_atol == math.inf
    assert got.max_abs_err == pytest.approx(0.5, rel=U32)  # b[-1] = a[-1] + 0.5 rounded to float32
    assert got.mean_abs_err == pytest.approx(want["mean_abs_err"], rel=2 * mean_error(n, U32))


# --- the smallest tolerances that pass ----------------------------------------------------------------------


@SETTINGS
@given(tensor_pairs(same_dtype=False, specials=False))
def test_required_atol_passes_and_anything_smaller_fails(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    a, b = pair
    assume(_no_tiny_values(a, b))
    required = compare_tensors(a, b, atol=0, rtol=0).required_atol
    assert mismatches(a, b, required, 0.0) == 0
    if required > 0:
        assert mismatches(a, b, required * (1 - 1e-6), 0.0) > 0


@SETTINGS
@given(tensor_pairs(same_dtype=False, specials=False))
def test_required_rtol_passes_and_anything_smaller_fails(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    a, b = pair
    assume(_no_tiny_values(a, b))
    required = compare_tensors(a, b, atol=0, rtol=0).required_rtol
    assume(math.isfinite(required))  # inf: a zero reference against a nonzero value, no rtol passes
    assert mismatches(a, b, 0.0, required * (1 + 1e-6)) == 0
    if required > 0:
        assert mismatches(a, b, 0.0, required * (1 - 1e-6)) > 0


def test_required_atol_is_exactly_the_smallest() -> None:
    a, b = torch.tensor([0.1]), torch.tensor([0.0])  # |a - b| is 0.10000000149..., above the float64 0.1
    required = compare_tensors(a, b, atol=0, rtol=0).required_atol
    assert mismatches(a, b, required, 0.0) == 0
    assert mismatches(a, b, math.nextafter(required, 0.0), 0.0) == 1
    assert mismatches(a, b, 0.1, 0.0) == 1


def test_required_rtol_is_exactly_the_smallest() -> None:
    a = torch.tensor([3.0, 1.7, 2.3], dtype=torch.float64)
    b = torch.tensor([3.1, 2.0, 3.0], dtype=torch.float64)
    required = compare_tensors(a, b, atol=0, rtol=0).required_rtol
    assert mismatches(a, b, 0.0, required) == 0


def test_required_rtol_is_infinite_when_a_zero_reference_meets_a_nonzero_value() -> None:
    a, b = torch.tensor([0.0, 1.0]), torch.tensor([1e-3, 1.0])
    got = compare_tensors(a, b, atol=0, rtol=0)
    assert got.max_rel_err == math.inf and got.required_rtol == math.inf
    assert got.required_atol == pytest.approx(1e-3)
    assert mismatches(a, b, 0.0, 1e30) == 1  # no rtol passes, as inf says


# --- named clauses of the pass rule -------------------------------------------------------------------------


def test_nan_against_nan_passes_and_nan_against_a_number_diverges() -> None:
    a = torch.tensor([math.nan, math.nan, 1.0, math.inf, -math.inf])
    same = compare_tensors(a, a.clone(), atol=0, rtol=0)
    assert same.identical and same.within_tolerance
    b = torch.tensor([math.nan, 2.0, math.nan, math.inf, math.inf])
    got = compare_tensors(a, b, atol=1e9, rtol=1e9)
    assert got.nan_mismatch == 2  # NaN vs 2.0, 1.0 vs NaN
    assert got.inf_mismatch == 1  # -inf vs inf
    assert got.mismatched == 3 and not got.within_tolerance
    assert got.required_atol == math.inf and got.required_rtol == math.inf
    assert got.max_abs_err == 0.0  # nothing finite on both sides differs


def test_same_values_with_different_nan_payloads_are_close_not_identical() -> None:
    a = torch.tensor([math.nan, 1.0])
    b = a.clone()
    b.view(torch.int32)[0] += 1  # another NaN bit pattern
    assert math.isnan(float(b[0]))
    got = compare_tensors(a, b, atol=0, rtol=0)
    assert not got.identical and got.within_tolerance and got.nan_mismatch == 0


def test_bitwise_fast_path() -> None:
    a = torch.randn(64, generator=torch.Generator().manual_seed(0))
    got = compare_tensors(a, a.clone(), atol=0, rtol=0)
    assert got.identical and got.max_abs_err == 0 and got.cosine == 1.0 and got.required_atol == 0
    zero = compare_tensors(torch.tensor([0.0]), torch.tensor([-0.0]), atol=0, rtol=0)
    assert not zero.identical and zero.within_tolerance and zero.max_rel_err == 0.0
    cross = compare_tensors(a, a.double(), atol=0, rtol=0)  # same values, other dtype: not bitwise
    assert not cross.identical and cross.within_tolerance and cross.max_abs_err == 0


def test_cross_dtype_is_compared_after_upcasting() -> None:
    a = torch.tensor([1.0, 1.0 + 2**-10, 3.14159, -2.5e-3])
    b = a.to(torch.bfloat16)
    got = compare_tensors(a, b, atol=0, rtol=0)
    want = ref_metrics(a, b, 0, 0)
    assert got.max_abs_err == pytest.approx(want["max_abs_err"], rel=1e-9)
    assert got.max_abs_err == pytest.approx(float((a.double() - b.double()).abs().max()), rel=1e-9)
    assert got.max_abs_err > 0 and got.mismatched == want["mismatched"] == 3


def test_cosine_of_zero_vectors() -> None:
    z, x = torch.zeros(3), torch.tensor([1.0, 0.0, 0.0])
    assert compare_tensors(z, z.double(), atol=0, rtol=0).cosine == 1.0
    assert compare_tensors(z, x, atol=0, rtol=0).cosine == 0.0
    assert compare_tensors(x, -x, atol=0, rtol=0).cosine == -1.0


@pytest.mark.parametrize("value", [1e-23, 1e-30])
def test_cosine_of_tiny_values(value: float) -> None:
    """Orthogonal and opposite float32 vectors whose squares are below float32's range."""
    a = torch.tensor([value, 0.0])
    orthogonal, opposite = torch.tensor([0.0, value]), torch.tensor([-value, 0.0])
    assert compare_tensors(a, orthogonal, atol=0, rtol=0).cosine == pytest.approx(0.0, abs=1e-6)
    assert compare_tensors(a, opposite, atol=0, rtol=0).cosine == pytest.approx(-1.0, abs=1e-6)


def test_different_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"shapes differ: \(2, 3\) vs \(3, 2\)"):
        compare_tensors(torch.zeros(2, 3), torch.zeros(3, 2), atol=0, rtol=0)


def test_empty_tensors() -> None:
    got = compare_tensors(torch.zeros(0), torch.zeros(0, dtype=torch.float64), atol=0, rtol=0)
    assert got.numel == 0 and got.within_tolerance and got.mismatch_fraction == 0.0


def test_bitwise_equal_takes_a_one_element_view_with_a_stray_stride() -> None:
    view = torch.arange(12.0).reshape(3, 4)[1:2, 1]
    assert metrics.bitwise_equal(view, torch.tensor([5.0]))
    assert not metrics.bitwise_equal(view, torch.tensor([-5.0]))
