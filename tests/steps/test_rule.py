"""One test per clause of the pass rule (tracediff.steps.rule), on entries made by the recorder's encoder."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tracediff.steps.entries import tensor_entry, value_entry
from tracediff.steps.rule import judge
from tracediff.steps.stat_names import DEFAULT_STATS, NUMERIC_STATS

BASE = torch.tensor([0.5, -1.25, 2.0, 4.0])


def entry(t: torch.Tensor, stats: tuple[str, ...] | frozenset[str] = DEFAULT_STATS) -> dict:
    return tensor_entry(t, stats)


def test_missing_entry_diverges() -> None:
    v = judge(None, entry(BASE), atol=1.0, rtol=1.0)
    assert (v.status, v.clause, v.reason) == ("diverged", "missing", "only in B")
    assert judge(entry(BASE), None, atol=0, rtol=0).reason == "only in A"


def test_not_recorded_entry_diverges() -> None:
    v = judge({"error": "RuntimeError: meta tensor"}, entry(BASE), atol=1, rtol=0)
    assert (v.clause, v.reason) == ("not_recorded", "not recorded: RuntimeError: meta tensor")


def test_equal_contents_are_identical_whatever_the_memory_layout() -> None:
    m = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    v = judge(entry(m.t().contiguous()), entry(m.t()), atol=0, rtol=0)
    assert (v.status, v.clause, bool(v)) == ("identical", "identical", True)


def test_different_plain_values_diverge_under_any_tolerance() -> None:
    v = judge(value_entry(0.001), value_entry(0.0010001), atol=1.0, rtol=1.0)
    assert (v.status, v.clause, v.reason) == ("diverged", "values", "value 0.001 vs 0.0010001")
    assert judge(value_entry(math.nan), value_entry(math.nan), atol=0, rtol=0).status == "identical"


def test_different_rng_states_diverge() -> None:
    v = judge({"hash": "aa", "seed": 1}, {"hash": "bb", "seed": 1}, atol=1, rtol=1)
    assert (v.clause, v.reason) == ("values", "state differs (hash)")


def test_shape_or_dtype_change_diverges() -> None:
    assert judge(entry(BASE), entry(BASE.reshape(2, 2)), atol=1, rtol=1).reason == "shape [4] vs [2, 2]"
    v = judge(entry(BASE), entry(BASE.double()), atol=1, rtol=1)
    assert (v.clause, v.reason) == ("layout", "dtype float32 vs float64")


def test_new_nan_diverges_under_any_tolerance() -> None:
    with_nan = BASE.clone()
    with_nan[1] = math.nan
    v = judge(entry(BASE), entry(with_nan), atol=100.0, rtol=100.0)
    assert (v.clause, v.reason) == ("special_values", "nan count 0 vs 1")


def test_any_difference_diverges_in_exact_mode_and_reports_the_drift() -> None:
    v = judge(entry(BASE), entry(BASE + 1e-7), atol=0, rtol=0)
    assert (v.status, v.clause) == ("diverged", "exact")
    assert v.drift is not None and 0 < v.drift < 1e-6
    assert v.reason == f"contents differ (largest statistic drift {v.drift:.3g})"


def test_without_statistics_a_tolerance_cannot_pass_a_difference() -> None:
    v = judge(entry(BASE, ()), entry(BASE + 1e-7, ()), atol=1.0, rtol=0)
    assert (v.status, v.clause, v.drift) == ("diverged", "no_statistics", None)


def test_tolerance_rule_is_atol_plus_rtol_times_run_a() -> None:
    b = BASE.clone()
    b[3] = 4.5  # max moves by 0.5, mean by 0.125, std and abs_mean too
    assert judge(entry(BASE), entry(b), atol=0.5, rtol=0).status == "within_tolerance"
    assert judge(entry(BASE), entry(b), atol=0, rtol=0.125).status == "within_tolerance"  # 0.125 * |4.0|
    v = judge(entry(BASE), entry(b), atol=0.4, rtol=0)
    assert (v.status, v.clause) == ("diverged", "tolerance")
    assert v.reason == "max 4 vs 4.5: off by 0.5, allowed 0.4"


def test_permutation_passes_any_tolerance_and_only_exact_mode_sees_it() -> None:
    swapped = BASE[[1, 0, 2, 3]]
    assert judge(entry(BASE), entry(swapped), atol=1e-12, rtol=0).status == "within_tolerance"
    assert judge(entry(BASE), entry(swapped), atol=0, rtol=0).status == "diverged"


@settings(max_examples=40, deadline=None)
@given(st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, width=32),
       st.floats(min_value=0, max_value=10), st.floats(min_value=0, max_value=1))
def test_a_constant_shift_passes_exactly_when_atol_plus_rtol_covers_every_statistic(
    shift: float, atol: float, rtol: float
) -> None:
    a, b = entry(BASE, NUMERIC_STATS), entry(BASE + shift, NUMERIC_STATS)
    if a["hash"] == b["hash"]:
        return
    gaps = {s: abs(b["stats"][s] - a["stats"][s]) for s in ("min", "max", "mean", "abs_mean", "std", "median")}
    expected = all(gap <= atol + rtol * abs(a["stats"][s]) for s, gap in gaps.items())
    verdict = judge(a, b, atol=atol, rtol=rtol)
    if atol == 0 and rtol == 0:
        assert verdict.status == "diverged"
    else:
        assert (verdict.status == "within_tolerance") == expected
