"""The one-process report and the ``--distributed`` report of the same pair, compared field by field.

Equal: every field but these. ``mean_abs_err``, ``rms_err`` and ``cosine`` add the same float32 products in
another grouping (each rank's slice is chunked on its own): each is within ``tests/rounding.py``'s bound of
the exact value for the row's ``n`` elements, so the two are within twice that, on any CPU and in any order
(``TRACEDIFF_REORDER=1``). ``pcc`` of a sliced row merges the float64 moments of the ranks' chunks where one
process merges those of its own chunks (``tracediff/compare/moments.py``): within twice the float64 bound.
A replica's finding says "its bytes differ" instead of how far. See docs/distributed.md.
"""

from __future__ import annotations

import math
from typing import Any

from tests.rounding import U64, chunked_sum, cosine_error, pcc_error, unit_of

# Relative error of a mean of n float32 products; rms is the square root of one (half of it), but it is also
# clamped between mean_abs_err and max_abs_err (1-Lipschitz, max_abs_err exact): the larger bound covers both.
_MEANS = {"mean_abs_err", "rms_err"}
# The test models' activations: |mean| under 10 spreads, so kappa = 1 + mean^2 / var under 101 (a property of
# the data, the same on any CPU); it only scales the float64 bound, ~1e-11 for these rows against 1e-7 of
# the float32 sums the reports were once 1.5e-7 apart by.
_KAPPA = 101.0


def assert_same_report(one: Any, apart: Any, where: str = "", row: dict[str, Any] | None = None) -> None:
    """``one`` (the JSON report of one process) equals ``apart`` (of ``--distributed``) within the bounds above.

    ``row``: the row (a dict with ``shape_b`` and the dtypes) that holds the value compared, found on the way."""
    if isinstance(one, dict):
        assert isinstance(apart, dict) and one.keys() == apart.keys(), where
        row = one if "shape_b" in one and "dtype_a" in one else row
        for key in one:
            if key == "detail" and "differs on rank" in str(one[key]):  # how far: known only where both copies are
                assert one[key].split(" (")[0] == apart[key].split(" (")[0], where
                continue
            assert_same_report(one[key], apart[key], f"{where}.{key}", row)
    elif isinstance(one, list):
        assert isinstance(apart, list) and len(one) == len(apart), where
        for i, (x, y) in enumerate(zip(one, apart)):
            assert_same_report(x, y, f"{where}[{i}]", row)
    elif isinstance(one, float) and isinstance(apart, float) and math.isnan(one) and math.isnan(apart):
        return
    elif isinstance(one, float) and where.rsplit(".", 1)[-1] in (*_MEANS, "cosine", "pcc") and row is not None:
        assert isinstance(apart, float), where
        assert abs(apart - one) <= _bound(where.rsplit(".", 1)[-1], one, row), (where, one, apart)
    else:
        assert one == apart, where


def _bound(field: str, value: float, row: dict[str, Any]) -> float:
    """How far the two paths' ``field`` may be apart: twice what each may be from the exact value."""
    n = math.prod(row["shape_b"] or [0])
    u = unit_of(str(row.get("dtype_a")), str(row.get("dtype_b")))
    if field in _MEANS:  # the sum's error, then one rounding for the quotient and one for the square root
        e = chunked_sum(n, u) + 2 * U64
        return 2 * e / (1 - e) * abs(value)  # |exact| <= |value| / (1 - e); 0 for an identical pair
    if field == "cosine":
        return 2 * cosine_error(n, u, value)
    return 2 * pcc_error(n, value, _KAPPA)
