"""Rotary orders (side-by-side pairs against halves) are looked for only where the recorded order does not fit."""

from __future__ import annotations

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


def _capture(model: nn.Module, x: torch.Tensor, out: Path) -> Path:
    with torch.no_grad(), tracediff.capture(model, out):
        model(x)
    return out


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
    torch.manual_seed(0)
    reference, x = Projection(), torch.randn(64, 32)
    port = Projection()
    with torch.no_grad():
        port.q_proj.weight.copy_(reference.q_proj.weight + 1e-4 * torch.randn_like(reference.q_proj.weight))
        port.q_proj.bias.copy_(reference.q_proj.bias)
    a, b = _capture(reference, x, tmp_path / "a"), _capture(port, x, tmp_path / "b")
    result = tracediff.align(a, b, atol=1e-7, rtol=0)
    assert result.first_divergence is not None  # the noise fails a tolerance this tight...
    assert counted_orders == []  # ...and fits as recorded: no order is tried on any tensor
    assert all(row.transform is None for row in result.rows)


def test_a_projection_converted_to_halves_is_compared_in_its_order(
    tmp_path: Path, counted_orders: list[tuple[int, ...]]
) -> None:
    torch.manual_seed(0)
    reference, x = Projection(), torch.randn(64, 32)
    port = Projection()
    with torch.no_grad():
        port.q_proj.weight.copy_(_pairs_to_halves(reference.q_proj.weight))
        port.q_proj.bias.copy_(_pairs_to_halves(reference.q_proj.bias[:, None])[:, 0])
    a, b = _capture(reference, x, tmp_path / "a"), _capture(port, x, tmp_path / "b")
    result = tracediff.align(a, b)
    assert counted_orders  # the recorded order does not fit: the orders were tried...
    assert result.passed, result.first_divergence  # ...and the one of the conversion found
    assert any(row.transform for row in result.rows if row.tensor == "outputs")
