"""The approximate verdict from recorded statistics (rows marked ``approximate``), one test per clause."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tracediff.capturing.stats import tensor_stats
from tracediff.compare.records import compare_records, compare_stats
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
    # X * (1 + 1e-5) scales every statistic by 1 + 1e-5, each element rounded once (at most eps32 / 2 = 6e-8
    # relative) and the moments summed in float64: the needed rtol is 1e-5 within ~1e-7 on any CPU, far inside
    # (5e-6, 5e-5), which only separates it from 0 and from the 5e-5 string allowance.
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


def test_equal_statistics_give_the_same_row_as_comparing_each_one() -> None:
    """Equal statistics are settled at once; the row must be the one the statistic-by-statistic loop gives."""
    stats = {"numel": 32, "mean": 0.25, "std": math.nan, "min": -math.inf, "max": 3.0, "abs_mean": 1.0,
             "nan": 2, "posinf": 0, "neginf": 1}
    ra = TensorRecord(slot="outputs", order=0, shape=(4, 8), dtype="torch.float32", stats=stats)
    rb = TensorRecord(slot="outputs", order=0, shape=(4, 8), dtype="torch.float32", stats=dict(stats))
    # the same numbers as new objects (NaN != NaN): not equal dicts, so every statistic is compared in turn
    rc = TensorRecord(slot="outputs", order=0, shape=(4, 8), dtype="torch.float32",
                      stats={k: v + 0.0 if isinstance(v, float) else v for k, v in stats.items()})
    assert rb.stats == ra.stats and rc.stats != ra.stats
    fast = compare_stats(ra, rb, atol=1e-5, rtol=1.3e-6)
    slow = compare_stats(ra, rc, atol=1e-5, rtol=1.3e-6)
    assert fast["status"] == "close" and fast["max_abs_err"] == 0.0
    assert fast.keys() == slow.keys()
    for key in fast:
        assert fast[key] == slow[key] or (math.isnan(fast[key]) and math.isnan(slow[key])), key


def test_pairs_with_equal_statistics_share_one_result_that_nobody_can_change() -> None:
    """The result of equal statistics is built once and shared: a note for one pair must not reach another."""
    stats = {"numel": 8, "mean": 0.5, "std": 1.0, "min": -1.0, "max": 2.0, "abs_mean": 0.75}
    flat = TensorRecord(slot="outputs", order=0, shape=(8,), dtype="torch.float32", stats=stats)
    column = TensorRecord(slot="outputs", order=1, shape=(8, 1), dtype="torch.float32", stats=dict(stats))
    first = compare_stats(flat, flat, atol=1e-5, rtol=1.3e-6)
    assert compare_stats(flat, column, atol=1e-5, rtol=1.3e-6) is first
    with pytest.raises(TypeError):
        first["reason"] = "changed"  # type: ignore[index]
    squeezed = compare_records(None, flat, None, column, atol=1e-5, rtol=1.3e-6)  # type: ignore[arg-type]
    assert squeezed["status"] == "close" and squeezed["reason"].endswith("; compared after squeezing singleton "
                                                         "dimensions: [8] vs [8, 1]")
    assert first["reason"] == "compared on statistics only: mean, std, min, max, abs_mean"
    assert compare_records(None, flat, None, flat, atol=1e-5, rtol=1.3e-6) is first  # type: ignore[arg-type]


# --- the loop of compare_stats is written for speed; this is its rule written plainly, as the oracle ---

def _plain_rule(ra: TensorRecord, rb: TensorRecord, atol: float, rtol: float) -> tuple[Any, ...]:
    def rounding(record: TensorRecord, value: float) -> float:
        return 0.0 if "numel" in record.stats or not math.isfinite(value) else 5e-5 * abs(value)

    def overflowed(record: TensorRecord, key: str, value: float) -> bool:
        bounds = [record.stats.get(k) for k in ("min", "max")]
        return (key in ("mean", "std", "abs_mean") and not math.isfinite(value)
                and all(isinstance(v, (int, float)) and math.isfinite(v) for v in bounds))

    keys = [k for k in ("mean", "std", "min", "max", "abs_mean") if k in ra.stats and k in rb.stats]
    worst_abs, worst_rel, need_atol, need_rtol, failing = 0.0, 0.0, 0.0, 0.0, []
    for key in keys:
        va, vb = float(ra.stats[key]), float(rb.stats[key])
        if math.isnan(va) and math.isnan(vb) or va == vb or overflowed(ra, key, va) or overflowed(rb, key, vb):
            continue
        diff = abs(va - vb)
        diff = math.inf if math.isnan(diff) else diff
        excess = max(0.0, diff - rounding(ra, va) - rounding(rb, vb))
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / abs(va) if va else math.inf)
        need_atol = max(need_atol, excess)
        need_rtol = max(need_rtol, excess / abs(va) if va else (math.inf if excess else 0.0))
        if not (math.isfinite(excess) and excess <= atol + rtol * abs(va)):
            failing.append(key)
    return worst_abs, worst_rel, need_atol, need_rtol, failing


_VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0, -2.5, 1e308]))


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(["mean", "std", "min", "max", "abs_mean"]), _VALUES, min_size=1),
       st.dictionaries(st.sampled_from(["mean", "std", "min", "max", "abs_mean"]), _VALUES, min_size=1),
       st.booleans(), st.booleans(), st.sampled_from([0.0, 1e-5, 1e-2]), st.sampled_from([0.0, 1.3e-6, 1e-2]))
def test_statistics_verdict_follows_the_plain_rule(stats_a: dict[str, float], stats_b: dict[str, float],
                                                   numel_a: bool, numel_b: bool, atol: float, rtol: float) -> None:
    ra = TensorRecord(slot="outputs", order=0, shape=(4,), dtype="torch.float32",
                      stats=stats_a | ({"numel": 4} if numel_a else {}))
    rb = TensorRecord(slot="outputs", order=0, shape=(4,), dtype="torch.float32",
                      stats=stats_b | ({"numel": 4} if numel_b else {}))
    if not set(stats_a) & set(stats_b):
        return
    got = compare_stats(ra, rb, atol=atol, rtol=rtol)
    worst_abs, worst_rel, need_atol, need_rtol, failing = _plain_rule(ra, rb, atol, rtol)
    same = [(got["max_abs_err"], worst_abs), (got["max_rel_err"], worst_rel),
            (got["required_atol"], need_atol), (got["required_rtol"], need_rtol)]
    assert all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in same), (same, got)
    assert got["within_tolerance"] is (not failing)
    if failing:  # "compared on statistics only: mean 0.1 vs 0.2, max 3 vs 4"
        assert [part.split(" ")[0] for part in got["reason"].split(": ", 1)[1].split(", ")] == failing
