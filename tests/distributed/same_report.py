"""The one-process report and the ``--distributed`` report of the same pair, compared field by field.

Allowed: ``mean_abs_err``, ``rms_err`` and ``cosine`` add their sums in another order (float32 sums of each
chunk: within 1e-5 relative, far below any tolerance); ``pcc`` of a sliced row merges float64 moments where
the one-process pass sums float32 within a chunk (within 1e-7: ``compare/row_pass.py``); a replica's finding
says "its bytes differ" instead of how far. See docs/distributed.md.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

_ROUNDED = {"mean_abs_err", "rms_err", "cosine"}


def assert_same_report(one: Any, apart: Any, where: str = "") -> None:
    """``one`` (the JSON report of one process) equals ``apart`` (of ``--distributed``) within the allowances."""
    if isinstance(one, dict):
        assert isinstance(apart, dict) and one.keys() == apart.keys(), where
        for key in one:
            if key == "detail" and "differs on rank" in str(one[key]):  # how far: known only where both copies are
                assert one[key].split(" (")[0] == apart[key].split(" (")[0], where
                continue
            assert_same_report(one[key], apart[key], f"{where}.{key}")
    elif isinstance(one, list):
        assert isinstance(apart, list) and len(one) == len(apart), where
        for i, (x, y) in enumerate(zip(one, apart)):
            assert_same_report(x, y, f"{where}[{i}]")
    elif isinstance(one, float) and where.rsplit(".", 1)[-1] in _ROUNDED:
        assert apart == pytest.approx(one, rel=1e-5, abs=1e-12), where
    elif isinstance(one, float) and where.endswith(".pcc"):
        assert apart == pytest.approx(one, rel=0, abs=1e-7) or (math.isnan(one) and math.isnan(apart)), where
    else:
        assert one == apart, where
