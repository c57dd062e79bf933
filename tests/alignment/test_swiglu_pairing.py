"""An activation of one input against a gated activation of two (transformers' fused experts: ``act_fn(gate) *
up`` from parameters of their own, against mlx-lm's ``SwitchGLU``: ``up_proj``, ``gate_proj``, then
``SwiGLU(up, gate)``, which multiplies inside the call) does not pair: their results differ by design. The
MLPs around them pair and are compared, so a clean port passes and a wrong ``up`` projection is still named.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import tracediff

DIM, HIDDEN = 8, 16


class GatedMlp(nn.Module):
    """transformers' way: fused weights of its own, an activation module that sees the gate only, the product
    taken in the MLP's code."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_up = nn.Parameter(torch.randn(2 * HIDDEN, DIM) / DIM**0.5)
        self.down = nn.Parameter(torch.randn(DIM, HIDDEN) / HIDDEN**0.5)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
        return F.linear(self.act_fn(gate) * up, self.down)


class SwiGLU(nn.Module):
    def forward(self, up: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up


class SwitchMlp(nn.Module):
    """mlx-lm's way: the activation module takes up and gate, and multiplies inside."""

    def __init__(self) -> None:
        super().__init__()
        self.up_proj = nn.Linear(DIM, HIDDEN, bias=False)
        self.gate_proj = nn.Linear(DIM, HIDDEN, bias=False)
        self.down_proj = nn.Linear(HIDDEN, DIM, bias=False)
        self.activation = SwiGLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self.up_proj(x)
        return self.down_proj(self.activation(up, self.gate_proj(x)))


class Model(nn.Module):
    def __init__(self, mlp: type[nn.Module]) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.mlp = mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


def traces(tmp_path: Path, *, bug: bool) -> tuple[Path, Path]:
    torch.manual_seed(0)
    reference = Model(GatedMlp).eval()
    port = Model(SwitchMlp).eval()
    with torch.no_grad():
        port.norm.load_state_dict(reference.norm.state_dict())
        gate, up = reference.mlp.gate_up.chunk(2)
        port.mlp.gate_proj.weight.copy_(gate)
        port.mlp.up_proj.weight.copy_(up)
        port.mlp.down_proj.weight.copy_(reference.mlp.down)
    if bug:
        with torch.no_grad():
            port.mlp.up_proj.weight.mul_(1.5)
    x = torch.randn(2, 5, DIM, generator=torch.Generator().manual_seed(1))
    for name, model in (("a", reference), ("b", port)):
        with torch.no_grad(), tracediff.capture(model, tmp_path / name):
            model(x)
    return tmp_path / "a", tmp_path / "b"


def test_the_gated_activation_is_left_unpaired_and_the_clean_port_passes(tmp_path: Path) -> None:
    result = tracediff.align(*traces(tmp_path, bug=False))
    # without the rule, act_fn pairs with activation and their outputs (silu(gate) against silu(gate) * up) diverge
    assert result.passed, result.first_divergence
    assert not [row for row in result.rows if (row.module_path_b or "").endswith("mlp.activation")]
    assert any(row.module_path_b == "Model.mlp" and row.tensor_b == "outputs" for row in result.rows)


def test_a_wrong_up_projection_is_still_named(tmp_path: Path) -> None:
    result = tracediff.align(*traces(tmp_path, bug=True))
    assert not result.passed
    assert result.first_divergence is not None
    assert result.first_divergence.module_path_b.startswith("Model.mlp")
