"""The pass rule, written once: B's value ``b`` passes against A's value ``a`` when

    |a - b| <= atol + rtol * |a|

``a`` is the reference, so the rule is not symmetric (as ``torch.testing.assert_close`` and
``numpy.isclose``). The functions take floats or numpy arrays alike. NaN never passes here:
the callers decide first what a NaN against a NaN means (see :mod:`tracediff.compare.metrics`).
"""

from __future__ import annotations

from typing import Any


def allowed_error(scale: Any, atol: float, rtol: float) -> Any:
    """The largest ``|a - b|`` that passes where ``|a|`` is ``scale``: ``atol + rtol * scale``."""
    return atol + rtol * scale


def passes(error: Any, scale: Any, atol: float, rtol: float) -> Any:
    """``error <= atol + rtol * scale``: a bool for floats, a bool array for arrays (False for NaN)."""
    return error <= allowed_error(scale, atol, rtol)
