"""A call's local error: B's module run alone on the inputs A's trace recorded for it, against A's outputs.

This is replay's local error (:mod:`tracediff.replaying`), kept as tensors:
``delta[slot] = B's output - A's recorded output`` is what restoring the
call's math subtracts later (:mod:`.restore`). The number reported is the
local error in units of the precision noise: ``rms(b - a) / noise`` with
``noise = eps(B's dtype) / 2 * rms(a)``, one rounding of the output in B's
dtype (the floor of the replay's noise budget). The float64 run the replay
adds to it is not made here: quantized kernels take no float64 input
(``_weight_int4pack_mm``, int8 dynamic activations), and a quantized call is
never "same math" anyway; what is wanted is how far off it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..compare.relative import relative_of, relative_rms
from ..replaying.inputs import Inputs, NotRebuildable, Target, output_slots, rebuild_inputs
from ..replaying.shadow import seed_rng
from ..trace.load import Trace
from ..trace.model import Node


@dataclass
class LocalError:
    """One call's local error; ``delta`` by output slot (B's dtype and device), empty when none was measured."""

    delta: dict[str, torch.Tensor] = field(default_factory=dict)
    output: Any = None                # B's output on A's inputs (its containers, to hand A's values back in)
    rel_rms_err: float = math.nan     # rms(b - a) / rms(a) (tracediff.compare.relative), the worst slot
    max_abs_err: float = math.nan
    x_noise: float = math.nan         # rms(b - a) / (eps(dB) / 2 * rms(a)), the worst slot
    reason: str = ""                  # why nothing was measured


def _eps(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) if dtype.is_floating_point else 0.0


def local_error(trace: Trace, node_a: Node, module: nn.Module, target: Target, seed: int,
                own: Inputs | None = None) -> LocalError:
    """Run ``module`` on A's recorded inputs of ``node_a`` and compare with A's recorded outputs; never raises.

    ``own``: what B's own forward passed this call (the shadow run): an argument A's trace knows only by its
    repr (a KV cache) is taken from it (:func:`~tracediff.replaying.inputs.rebuild_inputs`)."""
    try:
        args, kwargs = rebuild_inputs(trace, node_a, target, own=own)
    except NotRebuildable as e:
        return LocalError(reason=f"A's inputs cannot be rebuilt: {e}")
    recorded = {r.slot: r for r in node_a.outputs() if r.has_payload}
    if not recorded:
        return LocalError(reason="A's trace holds no output payload for this call")
    try:
        with torch.no_grad():
            seed_rng(seed)
            output = module(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - B's module on A's inputs: reported, the call is skipped
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return LocalError(reason=f"B's module raised on A's inputs: {type(e).__name__}: {first}"[:300])
    result = LocalError(output=output)
    for slot, b in output_slots(output):
        record = recorded.get(slot)
        if record is None or not b.is_floating_point():
            continue
        a = trace.load(record)
        if tuple(a.shape) != tuple(b.shape):
            continue
        a64, b64 = a.to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
        diff = torch.where(torch.isfinite(a64) & torch.isfinite(b64), b64 - a64, torch.zeros_like(a64))
        rel = relative_rms(a64, b64)
        x_noise = relative_of(rel, _eps(b.dtype) / 2)  # rms(b - a) / (eps / 2 * rms(a))
        result.delta[slot] = diff.to(device=b.device, dtype=b.dtype)
        result.rel_rms_err = rel if math.isnan(result.rel_rms_err) else max(result.rel_rms_err, rel)
        result.x_noise = x_noise if math.isnan(result.x_noise) else max(result.x_noise, x_noise)
        worst = float(diff.abs().max()) if diff.numel() else 0.0
        result.max_abs_err = worst if math.isnan(result.max_abs_err) else max(result.max_abs_err, worst)
    if not result.delta:
        result.reason = "no floating output of B pairs with A's recorded outputs (slot or shape differs)"
    return result
