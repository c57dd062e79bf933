"""B's end-to-end error: its whole forward on A's top-level inputs against A's recorded final outputs."""

from __future__ import annotations

from typing import Any

import torch

from ..compare.metrics import max_abs_err
from ..compare.relative import SquareSums, square_sums
from ..trace.load import Trace
from .inputs import output_slots


def end_to_end_error(trace: Trace, output: Any) -> dict[str, Any] | None:
    """``tensors`` (the output slots compared), ``max_abs_err``, ``rms_err`` and ``rel_rms_err`` of B's
    ``output`` against the final outputs A's trace recorded; None when no floating slot pairs.

    The slots are pooled (laid end to end) and measured over the positions where both sides are finite, under
    the rule of :mod:`tracediff.compare.relative`."""
    recorded = {}
    for record in trace.roots[0].outputs():
        if record.has_payload:
            try:
                recorded[record.slot] = trace.load(record)
            except Exception:  # noqa: BLE001 - no end-to-end error then
                continue
    sums, worst = SquareSums(), 0.0
    slots = []
    for slot, tensor in output_slots(output):
        a = recorded.get(slot)
        if a is None or not a.is_floating_point() or tuple(a.shape) != tuple(tensor.shape):
            continue
        a64, b64 = a.to(torch.float64), tensor.detach().to("cpu", torch.float64)
        sums += square_sums(a64, b64)
        worst = max(worst, max_abs_err(a64, b64))
        slots.append(slot)
    if not slots:
        return None
    rms, rel = sums.rms_err, sums.relative_rms
    return {"tensors": slots, "max_abs_err": worst, "rms_err": rms, "rel_rms_err": rel}
