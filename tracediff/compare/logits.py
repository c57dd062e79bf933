"""What a language model's next-token distribution says: KL, top-k agreement, argmax flips, and PCC.

Over logits ``a`` (the reference) and ``b`` shaped ``[..., vocab]``, one
distribution per position (every leading index flattened, in order):

====================  ========================================================
``kl``                ``KL(softmax(a) || softmax(b))`` per position, in nats,
                      computed in float64 from log-softmax (never negative)
``topk_agreement``    per k: the mean over positions of ``|top_k(a) ∩
                      top_k(b)| / k`` (1.0: the same k tokens everywhere)
``flips``             positions where ``argmax(b) != argmax(a)``, each with the
                      reference's top-2 margin ``a[top1] - a[top2]``: a flip
                      at a small margin is a near tie the reference almost
                      made itself
====================  ========================================================

``pearson`` is the Pearson correlation of two tensors' elements (any shape),
1.0 for equal tensors and NaN when either side is constant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_TOP_K = (1, 5, 10)


@dataclass(frozen=True)
class ArgmaxFlip:
    """A position where the two sides pick another token; ``margin``: the reference's top-1 minus top-2 logit."""

    position: int
    token_a: int
    token_b: int
    margin: float


@dataclass(frozen=True)
class LogitsMetrics:
    """The next-token verdicts of one logits pair (see the module docstring)."""

    kl: tuple[float, ...]
    topk_agreement: dict[int, float]
    flips: tuple[ArgmaxFlip, ...]

    @property
    def kl_max(self) -> float:
        return max(self.kl, default=0.0)

    @property
    def kl_mean(self) -> float:
        return sum(self.kl) / len(self.kl) if self.kl else 0.0


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def logits_metrics(a: np.ndarray, b: np.ndarray, *, top_k: tuple[int, ...] = DEFAULT_TOP_K) -> LogitsMetrics:
    """KL per position, top-k agreement and argmax flips of ``b`` against the reference ``a`` (same shape)."""
    vocab = a.shape[-1]
    a2 = a.astype(np.float64, copy=False).reshape(-1, vocab)
    b2 = b.astype(np.float64, copy=False).reshape(-1, vocab)
    with np.errstate(all="ignore"):
        la, lb = _log_softmax(a2), _log_softmax(b2)
        kl = np.maximum((np.exp(la) * (la - lb)).sum(axis=-1), 0.0)
    order_a = np.argsort(-a2, axis=-1, kind="stable")
    order_b = np.argsort(-b2, axis=-1, kind="stable")
    agreement = {}
    for k in top_k:
        k_eff = min(k, vocab)
        shared = [len(set(order_a[i, :k_eff]) & set(order_b[i, :k_eff])) for i in range(a2.shape[0])]
        agreement[k] = float(np.mean(shared) / k_eff) if shared else 1.0
    flips = []
    for i in np.flatnonzero(order_a[:, 0] != order_b[:, 0]):
        top1, top2 = order_a[i, 0], order_a[i, 1] if vocab > 1 else order_a[i, 0]
        flips.append(ArgmaxFlip(int(i), int(top1), int(order_b[i, 0]), float(a2[i, top1] - a2[i, top2])))
    return LogitsMetrics(tuple(float(x) for x in kl), agreement, tuple(flips))


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """The Pearson correlation of the elements of ``a`` and ``b`` over positions finite on both sides."""
    a64, b64 = a.astype(np.float64, copy=False).ravel(), b.astype(np.float64, copy=False).ravel()
    keep = np.isfinite(a64) & np.isfinite(b64)
    if not keep.all():  # (a copy of every element is a copy for nothing when all are finite)
        a64, b64 = a64[keep], b64[keep]
    if a64.size < 2:
        return math.nan
    da, db = a64 - a64.mean(), b64 - b64.mean()
    denominator = math.sqrt(float(da @ da) * float(db @ db))
    return float(da @ db) / denominator if denominator > 0 else math.nan
