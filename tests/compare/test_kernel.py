"""The compiled one-pass kernel (tracediff/compare/kernel.py, fused.py) against the numpy path it replaces for
large pairs: the same counts, NaN/Inf mismatches, maxima, required tolerances and positions bit for bit, and
the sums within the rounding bound of each path, with ``TRACEDIFF_REORDER=1`` and without.

The bound (tests/rounding.py: Higham's bound holds for any order and grouping of a sum, so on any x86-64
CPU whatever its SIMD width): the numpy path is within ``mean_error(n, u)`` (``u`` its work precision) of the
exact mean and rms, within ``cosine_error(n, u, cos)`` of the exact cosine; the kernel takes each term from
the exactly widened values with at most two float64 roundings (the difference, the product) and adds the
``n`` terms in float64 in any order and grouping (SIMD lanes, blocks, chunks): within ``gamma(n + 1, U64)``
relative (taken as ``gamma(n + 2, U64)`` here), the quotient and root adding ``2 U64``. Both ``pcc`` come
from float64 block moments merged by Chan's formula: each within ``pcc_error``. Two values each within
``e`` of the exact one are within ``2 e`` of each other. The decisions (the pass rule, the maxima, NaN and
infinities) are the same float64 expressions on both paths, rounded alike on any IEEE-754 CPU (the kernel
lets the compiler reorder only its sums, and never fuses a multiply-add), so those results are equal.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
from collections.abc import Callable, Iterator
from dataclasses import fields
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.rounding import U64, cosine_error, gamma, kappa, mean_error, pcc_error
from tracediff import order
from tracediff.compare import kernel, metrics
from tracediff.compare.metrics import measure_tensors
from tracediff.native import fused_c
from tracediff.trace.payload import Payload, as_floats

_NUMBA = importlib.util.find_spec("numba") is not None
BUILDS = [pytest.param("c", marks=pytest.mark.skipif(fused_c.compiler() is None, reason="no C compiler")),
          pytest.param("numba", marks=pytest.mark.skipif(not _NUMBA, reason="numba is not installed"))]

Path = Callable[[str], None]
SUMS = ("mean_abs_err", "rms_err", "cosine")


@pytest.fixture(params=BUILDS)
def build(request: pytest.FixtureRequest) -> str:
    """Each build of the compiled pass in turn: C, then numba."""
    return str(request.param)


@pytest.fixture
def path(monkeypatch: pytest.MonkeyPatch, build: str) -> Iterator[Path]:
    """``path("kernel")`` sends every pair through the compiled kernel (the build under test), ``path("numpy")``
    through numpy; each call starts from a fresh state, as a new process would."""

    def choose(name: str) -> None:
        monkeypatch.setattr(kernel, "_state", kernel._State())
        if name == "numpy":
            monkeypatch.setenv(kernel.VARIABLE, "numpy")
        else:
            monkeypatch.setenv(kernel.VARIABLE, build)
            monkeypatch.setattr(kernel, "MIN_ELEMENTS", 1)
            assert kernel.load() is not None  # loaded now, not in the background

    yield choose


@pytest.fixture(params=[None, "1"], ids=["in order", "TRACEDIFF_REORDER=1"])
def reorder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.param is None:
        monkeypatch.delenv(order.VARIABLE, raising=False)
    else:
        monkeypatch.setenv(order.VARIABLE, request.param)
    order.reordered.cache_clear()
    yield
    order.reordered.cache_clear()


def _bf16(values: np.ndarray) -> Payload:
    bits = values.astype(np.float32).view(np.uint32)
    return Payload(((bits + 0x8000) >> 16).astype(np.uint16), "bfloat16")


def _as(values: np.ndarray, dtype: str) -> Payload | np.ndarray:
    return _bf16(values) if dtype == "bfloat16" else values.astype(dtype)


def _f64(side: Payload | np.ndarray) -> np.ndarray:
    return as_floats(side.values, side.dtype, np.float64) if isinstance(side, Payload) else side.astype(np.float64)


def _kernel_sum_error(n: int) -> float:
    """Relative bound of the kernel's mean or rms of ``n`` elements (see the module docstring)."""
    return gamma(n + 2, U64) + 2 * U64


def _kernel_cosine_error(n: int, cosine: float) -> float:
    """Bound on ``|computed - exact|`` of the kernel's cosine, as ``tests.rounding.cosine_error`` derives it,
    with the kernel's sums: the dot product within ``gamma(n + 2) |a| |b|``, each squared norm within
    ``gamma(n + 2)`` relative, one rounding for the quotient."""
    e = gamma(n + 2, U64)
    return e + abs(cosine) * (e + 2 * U64)


def _both(a: Payload | np.ndarray, b: Payload | np.ndarray, path: Path, along: int | None, atol: float = 1e-5,
          rtol: float = 1.3e-6) -> tuple[tuple[metrics.PairMetrics, metrics.RowExtras], ...]:
    found = []
    for name in ("numpy", "kernel"):
        path(name)
        found.append(measure_tensors(a, b, atol=atol, rtol=rtol, along=along))
    return tuple(found)


def _assert_same(a: Payload | np.ndarray, b: Payload | np.ndarray, numpy_found: tuple[metrics.PairMetrics,
                 metrics.RowExtras], kernel_found: tuple[metrics.PairMetrics, metrics.RowExtras], unit: float) -> None:
    (mn, xn), (mk, xk) = numpy_found, kernel_found
    for field in fields(mn):
        if field.name not in SUMS:
            assert getattr(mk, field.name) == getattr(mn, field.name), field.name
    assert xk.positions == xn.positions
    x, y = _f64(a).reshape(-1), _f64(b).reshape(-1)
    keep = np.isfinite(x) & np.isfinite(y)
    n = int(keep.sum())
    for name in ("mean_abs_err", "rms_err"):
        e = mean_error(n, unit) + _kernel_sum_error(n)
        assert abs(getattr(mk, name) - getattr(mn, name)) <= e * getattr(mn, name) / (1 - e), name
    cos_bound = cosine_error(n, unit, mn.cosine) + _kernel_cosine_error(n, mn.cosine)
    assert abs(mk.cosine - mn.cosine) <= cos_bound
    if xn.pcc is None or math.isnan(xn.pcc):
        assert xk.pcc is None if xn.pcc is None else math.isnan(xk.pcc)  # type: ignore[arg-type]
    else:
        assert xk.pcc is not None
        assert abs(xk.pcc - xn.pcc) <= 2 * pcc_error(n, xn.pcc, kappa(x[keep], y[keep]))


def _noise(rng: np.random.Generator, a: np.ndarray) -> np.ndarray:
    return a + rng.normal(0, 1e-5, a.shape)


CASES: dict[str, Callable[[np.random.Generator, np.ndarray], np.ndarray]] = {
    "noise near the tolerance": _noise,
    "large mean": lambda rng, a: a + 300 + rng.normal(0, 1e-3, a.shape),
    "anticorrelated": lambda rng, a: -a + rng.normal(0, 1e-2, a.shape),
    "last positions changed": lambda rng, a: np.concatenate([a[:, :30], a[:, 30:] * 1.01], axis=1),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_kernel_and_numpy_find_the_same_row(case: str, dtype: str, path: Path, reorder: None) -> None:
    rng = np.random.default_rng(1)
    a64 = rng.normal(0, 1, (2, 37, 96))
    b64 = CASES[case](rng, a64)
    a, b = _as(a64, dtype), _as(b64, dtype)
    found = _both(a, b, path, along=1)
    assert found[0][0].mismatched  # a pair out of tolerance: positions are found too
    _assert_same(a, b, *found, unit=U64 if dtype == "float64" else 2.0 ** -24)


@pytest.mark.parametrize("dtypes", [("float32", "float16"), ("float32", "float64"), ("bfloat16", "float32")])
def test_mixed_dtypes_are_converted_chunk_by_chunk_as_numpy_does(dtypes: tuple[str, str], path: Path,
                                                                 reorder: None) -> None:
    rng = np.random.default_rng(2)
    a64 = rng.normal(0, 1, (3, 41, 50))
    a, b = _as(a64, dtypes[0]), _as(_noise(rng, a64), dtypes[1])
    found = _both(a, b, path, along=1)
    _assert_same(a, b, *found, unit=U64 if "float64" in dtypes else 2.0 ** -24)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nan_and_infinities_count_and_mark_as_numpy_does(dtype: str, path: Path, reorder: None) -> None:
    """Every non-finite case: NaN on one side or both, the same or another infinity, an infinity against a
    number on either side (A's infinity against a number passes the positions' rule with rtol > 0: as numpy)."""
    rng = np.random.default_rng(3)
    a = rng.normal(0, 1, (2, 64, 40)).astype(dtype)
    b = (a + rng.normal(0, 1e-6, a.shape)).astype(dtype)
    specials = [(np.nan, 1.0), (1.0, np.nan), (np.nan, np.nan), (np.inf, np.inf), (np.inf, -np.inf),
                (-np.inf, 2.0), (3.0, np.inf), (0.0, 1e-3)]
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    for k, (va, vb) in enumerate(specials):
        flat_a[k * 601 + 5], flat_b[k * 601 + 5] = va, vb
    for atol, rtol in ((1e-5, 1.3e-6), (1e-5, 0.0)):
        path("numpy")
        numpy_found = measure_tensors(a, b, atol=atol, rtol=rtol, along=1)
        path("kernel")
        kernel_found = measure_tensors(a, b, atol=atol, rtol=rtol, along=1)
        assert numpy_found[0].nan_mismatch == 2 and numpy_found[0].inf_mismatch == 3
        _assert_same(a, b, numpy_found, kernel_found, unit=U64 if dtype == "float64" else 2.0 ** -24)


def test_elements_exactly_at_the_tolerance(path: Path, reorder: None) -> None:
    """|a - b| equal to atol + rtol |a| in float64 passes; one ulp above fails: decided alike on both paths."""
    a = np.full(4096, 1.0)
    b = a + 2.0 ** -10
    b[::3] = np.nextafter(b[::3], 2.0)
    found = _both(a, b, path, along=None, atol=2.0 ** -11, rtol=2.0 ** -11)
    assert found[0][0].mismatched == len(b[::3])
    _assert_same(a, b, *found, unit=U64)


def test_a_float32_difference_beyond_its_range_is_counted_as_numpy_does(path: Path, reorder: None) -> None:
    a = np.ones(5000, np.float32)
    b = a.copy()
    a[7], b[7] = 3e38, -3e38  # a float32 difference overflows, a float64 one does not
    b[100:200] += 1e-3
    found = _both(a, b, path, along=None)
    assert found[0][0].max_abs_err == 2 * float(np.float32(3e38)) and found[0][0].nan_mismatch == 0
    _assert_same(a, b, *found, unit=2.0 ** -24)


@pytest.mark.parametrize("scale", [1e-160, 1e200])
def test_float64_sums_out_of_range_are_summed_again_on_scaled_values(scale: float, path: Path) -> None:
    """Squares of 1e-160 underflow and of 1e200 overflow float64: those chunks take numpy's scaled sums."""
    rng = np.random.default_rng(4)
    a = rng.normal(0, 1, 3000) * scale
    b = a * (1 + rng.normal(0, 1e-3, a.shape))
    found = _both(a, b, path, along=None, atol=0.0, rtol=1e-4)
    assert 0 < found[1][0].rms_err < math.inf and 0.9 < found[1][0].cosine <= 1
    _assert_same(a, b, *found, unit=U64)


@pytest.fixture
def nothing_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """No C build cached yet (a first run): loading it builds it (or takes numba's where no compiler is)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))


def test_small_pairs_and_small_alignments_stay_on_numpy(monkeypatch: pytest.MonkeyPatch, nothing_cached: None
                                                        ) -> None:
    """Below MIN_ELEMENTS the kernel is never asked for; until START_BYTES were compared it is not loaded, and
    then it loads in the background while pairs go on to numpy."""
    monkeypatch.delenv(kernel.VARIABLE, raising=False)
    fresh = kernel._State()  # as in a new process
    monkeypatch.setattr(kernel, "_state", fresh)
    small = Payload(np.zeros(kernel.MIN_ELEMENTS - 1, np.float32), "float32")
    assert not kernel.wanted(small, small)
    large = Payload(np.zeros(kernel.MIN_ELEMENTS, np.float32), "float32")
    monkeypatch.setattr(kernel, "START_BYTES", 4 * large.values.nbytes)
    assert not kernel.wanted(large, large) and fresh.loader is None  # 2 pairs' bytes seen of the 4 needed
    assert not kernel.wanted(large, large)  # the 4th: loading starts, this pair still goes to numpy
    assert fresh.loader is not None
    fresh.loader.join()
    assert fresh.kernel is not None and kernel.wanted(large, large)


def test_a_large_alignment_of_differing_pairs_loads_the_kernel_early(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: pathlib.Path) -> None:
    """Told how many bytes are coming (expect), the kernel loads once EARLY_BYTES of differing pairs were seen
    with REMAINING_BYTES still to come, and that pair already goes through it; with less to come (only the last
    layers differ) it stays unloaded."""
    monkeypatch.delenv(kernel.VARIABLE, raising=False)
    large = Payload(np.zeros(kernel.MIN_ELEMENTS, np.float32), "float32")
    pair = 2 * large.values.nbytes
    monkeypatch.setattr(kernel, "START_BYTES", 100 * pair)
    monkeypatch.setattr(kernel, "EARLY_BYTES", 2 * pair)
    monkeypatch.setattr(kernel, "REMAINING_BYTES", 10 * pair)
    for remaining, loads in ((50, True), (5, False)):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / str(remaining)))  # nothing cached: a first run
        fresh = kernel._State()
        monkeypatch.setattr(kernel, "_state", fresh)
        kernel.expect(remaining * pair + 2 * pair)
        kernel.counted(pair)
        assert not kernel.wanted(large, large) and fresh.loader is None  # one pair's bytes seen of the two
        kernel.counted(pair)
        assert kernel.wanted(large, large) is loads, remaining
        assert (fresh.kernel is not None) is loads


def test_the_numpy_switch_turns_the_kernel_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernel.VARIABLE, "numpy")
    monkeypatch.setattr(kernel, "START_BYTES", 0)
    large = Payload(np.zeros(kernel.MIN_ELEMENTS, np.float32), "float32")
    assert not kernel.wanted(large, large)


def test_align_rows_are_the_same_on_both_paths(path: Path, reorder: None) -> None:
    import tracediff

    fixtures = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "llama_tiny"
    ref, bug = fixtures / "ref", fixtures / "port_bug"
    results = []
    for name in ("numpy", "kernel"):
        path(name)
        results.append(tracediff.align(ref, bug))
    numpy_rows, kernel_rows = (list(r.rows) for r in results)
    assert len(numpy_rows) == len(kernel_rows) and results[0].passed == results[1].passed
    trace_a, trace_b = tracediff.load_trace(ref), tracediff.load_trace(bug)
    records_a = {(node.module_path, node.call_index, r.slot): r for node, r in trace_a.records()}
    records_b = {(node.module_path, node.call_index, r.slot): r for node, r in trace_b.records()}
    compared = 0
    for rn, rk in zip(numpy_rows, kernel_rows):
        for field in fields(rn):
            if field.name not in (*SUMS, "pcc"):
                vn, vk = getattr(rn, field.name), getattr(rk, field.name)
                assert vn == vk or (vn != vn and vk != vk), (rn.tensor, field.name)
        if rn.status not in ("close", "diverged") or rn.approximate:
            continue
        ra = records_a[(rn.module_path_a, rn.call_index_a, rn.tensor_a)]
        rb = records_b[(rn.module_path_b, rn.call_index_b, rn.tensor)]
        a, b = trace_a.load_payload(ra), trace_b.load_payload(rb)
        _assert_same(a, b, (_row_metrics(rn), _row_extras(rn)), (_row_metrics(rk), _row_extras(rk)),
                     unit=U64 if "float64" in (a.dtype, b.dtype) else 2.0 ** -24)
        compared += 1
    assert compared


def _row_metrics(row: Any) -> metrics.PairMetrics:
    """The row's metrics as the pass returned them (the fields of a PairMetrics that a row keeps)."""
    names = {f.name for f in fields(metrics.PairMetrics)}
    kept = {name: getattr(row, name) for name in names if hasattr(row, name)}
    return metrics.PairMetrics(**{name: kept.get(name, 0) for name in names})


def _row_extras(row: Any) -> metrics.RowExtras:
    return metrics.RowExtras(row.pcc, None)


@st.composite
def wide_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays of one dtype, values anywhere in the range (subnormals, NaN and infinities included), some
    equal on both sides."""
    dtype = draw(st.sampled_from(["float32", "float64"]))
    n = draw(st.integers(1, 40))
    values = st.floats(width=32 if dtype == "float32" else 64)
    a = draw(st.lists(values, min_size=n, max_size=n))
    b = draw(st.lists(values | st.sampled_from(a), min_size=n, max_size=n))
    return np.array(a, dtype), np.array(b, dtype)


@pytest.mark.parametrize("build", BUILDS)
@settings(max_examples=80, deadline=None)
@given(pair=wide_pairs(), atol=st.sampled_from([0.0, 1e-5, 1.0]), rtol=st.sampled_from([0.0, 1.3e-6, 0.5]))
def test_exact_results_agree_over_the_whole_float_range(pair: tuple[np.ndarray, np.ndarray], atol: float,
                                                        rtol: float, build: str) -> None:
    a, b = pair
    a, b = np.tile(a, (3, 1)), np.tile(b, (3, 1))  # each position along dim 1 holds three elements
    found = []
    for name in ("numpy", build):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(kernel, "_state", kernel._State())
            patch.setenv(kernel.VARIABLE, name)
            if name != "numpy":
                patch.setattr(kernel, "MIN_ELEMENTS", 1)
                assert kernel.load() is not None
            found.append(measure_tensors(a, b, atol=atol, rtol=rtol, along=1))
    (mn, xn), (mk, xk) = found
    for field in fields(mn):
        if field.name not in SUMS:
            assert getattr(mk, field.name) == getattr(mn, field.name), field.name
    assert xk.positions == xn.positions
    for name in SUMS:  # within the bounds above where the sums stayed in range; the same infinities and NaN
        vn, vk = getattr(mn, name), getattr(mk, name)
        assert (math.isnan(vn) and math.isnan(vk)) or (math.isinf(vn) == math.isinf(vk)), name
