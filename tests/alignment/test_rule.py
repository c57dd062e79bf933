"""The one pass rule (``tracediff.compare.rule``) against numpy's ``isclose``, for floats and arrays alike."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from tracediff.compare.rule import allowed_error, passes

finite = st.floats(min_value=-1e30, max_value=1e30, allow_nan=False)
tolerance = st.floats(min_value=0.0, max_value=1e3, allow_nan=False)


@given(a=finite, b=finite, atol=tolerance, rtol=tolerance)
@example(a=0.0, b=1e-5, atol=1e-5, rtol=0.0)  # exactly atol passes
@example(a=-2.0, b=-2.0 - 2e-3, atol=0.0, rtol=1e-3)  # the scale is |a|, never a signed value
def test_the_rule_is_numpys_isclose_with_a_as_the_reference(a: float, b: float, atol: float, rtol: float) -> None:
    expected = bool(np.isclose(b, a, rtol=rtol, atol=atol))  # numpy scales by its second argument
    assert bool(passes(abs(a - b), abs(a), atol, rtol)) is expected
    arrays = passes(np.abs(np.array([a]) - np.array([b])), np.abs(np.array([a])), atol, rtol)
    assert arrays.tolist() == [expected]


def test_nan_never_passes_and_the_allowance_is_atol_plus_rtol_times_the_scale() -> None:
    assert not passes(math.nan, 1.0, 1.0, 1.0)
    assert not passes(math.inf, 1.0, 1.0, 1.0)
    assert allowed_error(4.0, 0.5, 0.25) == 1.5
    assert passes(1.5, 4.0, 0.5, 0.25) and not passes(1.5000001, 4.0, 0.5, 0.25)
