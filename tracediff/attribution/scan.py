"""The sensitivity scan the attribution replaces: quantize one call's module at a time, rerun, measure.

It is the ground truth an attribution is checked against
(``bench/bench_attribution.py``, ``scripts/attribution_validation.py``,
``tests/attribution``): for each module path, a fresh copy of the float model
has only that module quantized (by the caller's ``quantize(model, path)``,
which changes ``model`` in place), runs on the same inputs, and its final
error against the float model's output is measured with the same metric as
the attribution's (:mod:`.final`). N paths cost N model copies, N
quantizations and N forwards.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..replaying.inputs import output_slots
from .final import final_error


@dataclass(frozen=True)
class ScanResult:
    """The final error with each path alone quantized, by relative module path, and the scan's cost."""

    errors: dict[str, float]
    forward_passes: int
    seconds: float


def sensitivity_scan(model_a: nn.Module, quantize: Callable[[nn.Module, str], None], paths: Sequence[str],
                     kwargs: Mapping[str, Any]) -> ScanResult:
    """For each relative ``path``: quantize only that module of a copy of ``model_a``, run it on ``kwargs``
    and measure the final error against ``model_a``'s own output."""
    started = time.perf_counter()
    with torch.no_grad():
        reference = dict(output_slots(model_a(**kwargs)))
    errors: dict[str, float] = {}
    for path in paths:
        model = copy.deepcopy(model_a)
        quantize(model, path)
        with torch.no_grad():
            measured = final_error(reference, model(**kwargs))
        errors[path] = measured.value if measured is not None else float("nan")
    return ScanResult(errors=errors, forward_passes=len(paths) + 1, seconds=time.perf_counter() - started)
