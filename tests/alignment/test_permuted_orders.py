"""Rotary orders (side-by-side pairs against halves) are looked for only where the recorded order does not fit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff
from tracediff.alignment.pairing import permuted

HEAD = 8  # rotary head size of the toy projection: 4 pairs per head


class Projection(nn.Module):
    """A ``q_proj`` under a parent call that takes no part in the order (its output is the projection's)."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_proj(x)


def _traces(tmp_path: Path, convert: Callable[[torch.Tensor], torch.Tensor]) -> tuple[Path, Path]:
    """Traces of a projection and of its port, whose weight and bias are ``convert``ed (rows: outputs)."""
    torch.manual_seed(0)
    reference, port, x = Projection(), Projection(), torch.randn(64, 32)
    with torch.no_grad():
        port.q_proj.weight.copy_(convert(reference.q_proj.weight))
        port.q_proj.bias.copy_(convert(reference.q_proj.bias[:, None])[:, 0])
    for model, folder in ((reference, tmp_path / "a"), (port, tmp_path / "b")):
        with torch.no_grad(), tracediff.capture(model, folder):
            model(x)
    return tmp_path / "a", tmp_path / "b"


def _pairs_to_halves(weight: torch.Tensor) -> torch.Tensor:
    """The rows of ``weight`` per head: pairs side by side (x0 x1 x2 x3 ...) to halves (x0 x2 ... x1 x3 ...)."""
    rows = weight.shape[0]
    return weight.reshape(rows // HEAD, HEAD // 2, 2, -1).transpose(1, 2).reshape(weight.shape)


@pytest.fixture
def counted_orders(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    calls: list[tuple[int, ...]] = []
    real = permuted.pair_orders

    def counting(shape: tuple[int, ...]) -> list[permuted.Transform]:
        calls.append(shape)
        return real(shape)

    monkeypatch.setattr(permuted, "pair_orders", counting)
    return calls


def test_a_port_that_differs_by_noise_is_never_tried_in_other_orders(
    tmp_path: Path, counted_orders: list[tuple[int, ...]]
) -> None:
    noise = torch.Generator().manual_seed(1)
    a, b = _traces(tmp_path, lambda w: w + 1e-4 * torch.randn(w.shape, generator=noise))
    result = tracediff.align(a, b, atol=1e-7, rtol=0)
    assert result.first_divergence is not None  # the noise fails a tolerance this tight...
    assert counted_orders == []  # ...and fits as recorded: no order is tried on any tensor
    assert all(row.transform is None for row in result.rows)


def test_a_projection_converted_to_halves_is_compared_in_its_order(
    tmp_path: Path, counted_orders: list[tuple[int, ...]]
) -> None:
    a, b = _traces(tmp_path, _pairs_to_halves)
    result = tracediff.align(a, b)
    assert counted_orders  # the recorded order does not fit: the orders were tried...
    assert result.passed, result.first_divergence  # ...and the one of the conversion found
    assert any(row.transform for row in result.rows if row.tensor == "outputs")
