"""A divergence is named where its error starts, even when the error is below tolerance there.

A is a Llama in bfloat16; B is the same model, also in bfloat16, whose RMSNorm computes in bfloat16 instead
of upcasting to float32 (the port's mistake). The norm's output differs from A's by about one bfloat16 step:
within bfloat16's tolerance (rtol 1.6e-2) element by element. The projections that read it sum 32 such
values, and where their outputs are near zero the same error is beyond ``rtol * |a|``: they diverge, with
no more error than flowed into them. The norm made its error from inputs that held none (the embedding is
identical), A and B in one dtype: the divergence is named there, never at the projection after it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff
from tests.verdicts.ports import build, capture, plant

pytest.importorskip("transformers")


class NormWithoutUpcast(nn.Module):
    """transformers' ``LlamaRMSNorm`` without its float32 upcast: the statistics in the input's dtype."""

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        self.weight = original.weight
        self.variance_epsilon = original.variance_epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def without_upcast(model: nn.Module) -> nn.Module:
    for name, module in list(model.named_modules()):
        if type(module).__name__ == "LlamaRMSNorm":
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, NormWithoutUpcast(module))
    return model


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bf16-norm")
    capture(build("llama"), root / "a", torch.bfloat16)
    capture(without_upcast(build("llama")), root / "b", torch.bfloat16)
    capture(plant(build("llama"), "scaled-weight", 1), root / "scaled", torch.bfloat16)
    return root


def test_a_norm_without_upcast_is_named_at_the_norm(traces: Path) -> None:
    result = tracediff.align(traces / "a", traces / "b")
    first = result.first_divergence
    assert first is not None and not result.passed
    assert (first.module_path_b, first.tensor, first.origin) == ("LlamaModel.layers.0.input_layernorm", "outputs",
                                                                 "introduced")
    assert "made here (A and B in one dtype" in first.reason
    # the projections after it carry its error: not sources of their own
    q_proj = next(r for r in result.rows if r.module_path_b == "LlamaModel.layers.0.self_attn.q_proj"
                  and r.tensor == "outputs")
    assert q_proj.origin == "inherited"


def test_a_bug_in_bf16_beyond_what_flowed_in_is_still_named_at_its_module(traces: Path) -> None:
    # the same kernels on both sides: everything before layer 1's down_proj is identical
    result = tracediff.align(traces / "a", traces / "scaled")
    first = result.first_divergence
    assert first is not None
    assert (first.module_path_b, first.tensor, first.origin) == ("LlamaModel.layers.1.mlp.down_proj", "outputs",
                                                                 "introduced")
