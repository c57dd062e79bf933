"""Where a diverging row's error came from: ``origin``, ``input_err`` and ``amplification``.

A call's output row compares its error with the largest error among the call's input rows (``input_err``,
``amplification``): a diverging output whose inputs diverged ``inherited`` it, else the call ``introduced``
it. A diverging input that nothing recorded before it explains arose ``between modules`` (the caller's own
code), or is one of the ``model inputs``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..pair import Pair
from ..rows import RowDraft
from .sources import role


def set_origins(rows: Sequence[RowDraft], pairs: Sequence[Pair]) -> None:
    """Set input_err, amplification and origin of the drafts from the rows of what flowed into each call.

    ``pairs[i]`` is the pair row ``i`` compared: its call in B is the call the row belongs to.
    """
    roles = [role(row.tensor) for row in rows]
    # (call in B, pass) -> [largest error among its input rows (None: none measured), did one diverge]
    inputs: dict[tuple[int, str], list[Any]] = {}
    for row, (phase, side), pair in zip(rows, roles, pairs):
        if side == "in":
            seen = inputs.setdefault((id(pair.node_b), phase), [None, False])
            err = row.max_abs_err
            if err == err and (seen[0] is None or err > seen[0]):  # NaN (not measured) is left out
                seen[0] = err
            if row.within_tolerance is False:
                seen[1] = True
    earlier_divergence = False
    for row, (phase, side), pair in zip(rows, roles, pairs):
        found = inputs.get((id(pair.node_b), phase))
        input_err = found[0] if found is not None else None
        amplification = None
        error = row.max_abs_err
        if side == "out" and input_err is not None and error == error:
            if input_err > 0:
                amplification = error / input_err
            elif error > 0:
                amplification = math.inf
        origin = None
        if row.within_tolerance is False:  # row.diverged
            if side == "out" and (found is not None or row.op is None):
                origin = "inherited" if found is not None and found[1] else "introduced"
            elif side == "out":  # an op paired by value: its inputs were not compared, earlier rows tell
                origin = "inherited" if earlier_divergence else "introduced"
            elif "." not in row.module_path_b and phase == "forward" and row.op is None:
                origin = "model inputs"
            else:  # nothing recorded before it diverged: the caller's own code between module calls did it
                origin = "inherited" if earlier_divergence else "between modules"
            earlier_divergence = True
        if input_err is not None:
            row.input_err = input_err
            row.amplification = amplification
        if origin is not None:
            row.origin = origin
