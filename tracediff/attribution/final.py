"""The final-output error: how far B's whole output is from A's recorded output, as one number.

For a language model (an output slot named ``logits``, or ending in ``.logits``)
the number is the mean over positions of ``KL(p_A || p_B)``, the softmax of A's
logits against B's in nats, computed in float64, with the count of positions
whose top-1 token differs beside it. For any other model it is the relative mean
squared error over every floating output slot the two share:
``sum((a - b)^2) / sum(a^2)``, also in float64, over the positions where both are finite
(:func:`tracediff.compare.relative.relative_mse`).

Both are quadratic in a small error: two independent sources of error add
their shares, which is what makes "the share of the final error one call
causes" meaningful (an RMS would not add).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..compare.relative import SquareSums, square_sums
from ..replaying.inputs import output_slots

KL = "logits KL"
RELATIVE_MSE = "relative mse"


@dataclass(frozen=True)
class FinalError:
    """What was measured on the final output, and its value."""

    metric: str                     # ``logits KL`` or ``relative mse``
    value: float                    # the number the shares are taken of
    tensors: tuple[str, ...]        # the output slots it covers
    top1_flips: int | None = None   # positions whose argmax differs (language models)
    positions: int | None = None    # positions compared (language models)

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": self.value, "tensors": list(self.tensors),
                "top1_flips": self.top1_flips, "positions": self.positions}

    def describe(self) -> str:
        if self.metric == KL:
            return f"{self.metric} {self.value:.4g} nats/position, top-1 flips {self.top1_flips}/{self.positions}"
        return f"{self.metric} {self.value:.4g}"


def is_logits(slot: str) -> bool:
    return slot == "outputs.logits" or slot.endswith(".logits")


def final_error(recorded: Mapping[str, torch.Tensor], output: Any) -> FinalError | None:
    """B's ``output`` against A's ``recorded`` final outputs (by slot); None when no floating slot pairs."""
    pairs = []
    for slot, tensor in output_slots(output):
        a = recorded.get(slot)
        if a is None or not a.is_floating_point() or not tensor.is_floating_point() or a.shape != tensor.shape:
            continue
        pairs.append((slot, a, tensor.detach()))
    if not pairs:
        return None
    logits = [(slot, a, b) for slot, a, b in pairs if is_logits(slot)]
    if logits:
        slot, a, b = logits[0]
        kl, flips, positions = logits_kl(a, b)
        return FinalError(metric=KL, value=kl, tensors=(slot,), top1_flips=flips, positions=positions)
    value = sum((square_sums(a, b) for _, a, b in pairs), SquareSums()).relative_mse
    return FinalError(metric=RELATIVE_MSE, value=value, tensors=tuple(slot for slot, _, _ in pairs))


def logits_kl(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int, int]:
    """``(mean KL(softmax(a) || softmax(b)) over positions, top-1 flips, positions)``, over the last dimension."""
    a64 = a.to("cpu", torch.float64).reshape(-1, a.shape[-1])
    b64 = b.to("cpu", torch.float64).reshape(-1, b.shape[-1])
    log_a, log_b = torch.log_softmax(a64, dim=-1), torch.log_softmax(b64, dim=-1)
    per_position = (log_a.exp() * (log_a - log_b)).sum(dim=-1).clamp_min(0.0)  # KL >= 0; rounding can dip below
    flips = int((a64.argmax(dim=-1) != b64.argmax(dim=-1)).sum())
    return float(per_position.mean()), flips, int(a64.shape[0])
