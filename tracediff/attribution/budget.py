"""Mixed-precision advice: the N calls whose restoration, together, removes the most of the final error.

Shares measured one call at a time do not add: two layers may cause the same
part of the error (restoring either removes it), or compound. So the choice is
greedy and measured jointly: step k restores the k-1 calls already chosen plus
each remaining candidate, in one forward of B per candidate, and keeps the
candidate that leaves the smallest final error. ``budget`` steps over N
candidates cost at most ``budget * N`` forwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch

from .restore import Deltas
from .result import BudgetStep

#: ``(key, B's full module path, local error by slot, share measured alone)``
Candidate = tuple[tuple[str, int], str, Mapping[str, torch.Tensor], float]


def greedy(candidates: Sequence[Candidate], final_with: Callable[[Deltas], float], base: float,
           budget: int) -> list[BudgetStep]:
    """Up to ``budget`` steps; ``final_with(deltas)`` is B's final error with those calls restored at once."""
    chosen: dict[tuple[str, int], Mapping[str, torch.Tensor]] = {}
    steps: list[BudgetStep] = []
    summed = 0.0
    remaining = list(candidates)
    while remaining and len(steps) < budget:
        best: tuple[float, int] | None = None
        for i, (key, _, delta, _) in enumerate(remaining):
            value = final_with({**chosen, key: delta})
            if not math.isnan(value) and (best is None or value < best[0]):
                best = (value, i)
        if best is None:
            break
        value, i = best
        key, path, delta, alone = remaining.pop(i)
        chosen[key] = delta
        summed += alone
        share = min(1.0, max(0.0, (base - value) / base)) if base > 0 else 0.0
        steps.append(BudgetStep(module_path=path, call_index=key[1], final_error_restored=value, share=share,
                                summed_share=summed))
    return steps
