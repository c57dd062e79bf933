"""One computation cut at two points (transformers' Gemma 2 scales the embedding inside ``embed_tokens``,
mlx-lm right after it): the embedding's outputs differ by design and are accepted on the evidence of the next
input, which agrees; a wrong embedding, or a wrong scale after it, still diverges.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import tracediff

VOCAB, DIM = 20, 8


class ScaledEmbedding(nn.Embedding):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) * DIM**0.5


class Model(nn.Module):
    def __init__(self, *, scale_inside: bool, scale: float = DIM**0.5) -> None:
        super().__init__()
        self.scale_inside, self.scale = scale_inside, scale
        self.embed_tokens = ScaledEmbedding(VOCAB, DIM) if scale_inside else nn.Embedding(VOCAB, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.proj = nn.Linear(DIM, DIM)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(ids)
        if not self.scale_inside:
            h = h * self.scale
        return self.proj(self.norm(h))


def align(tmp_path: Path, port: Model, *, edit: bool = False) -> tracediff.Alignment:
    torch.manual_seed(0)
    reference = Model(scale_inside=True).eval()
    port.load_state_dict(reference.state_dict())
    if edit:
        with torch.no_grad():
            port.embed_tokens.weight[3:].mul_(1.1)
    ids = torch.arange(10).reshape(1, 10)
    for name, model in (("a", reference), ("b", port.eval())):
        with torch.no_grad(), tracediff.capture(model, tmp_path / name):
            model(ids)
    return tracediff.align(tmp_path / "a", tmp_path / "b")


def test_an_output_cut_at_another_point_is_accepted_on_the_input_that_agrees(tmp_path: Path) -> None:
    result = align(tmp_path, Model(scale_inside=False))
    assert result.passed
    row = next(r for r in result.rows if r.module_path_b == "Model.embed_tokens" and r.tensor_b == "outputs")
    assert row.status == "close" and row.max_abs_err > 1  # the values differ by the scale: accepted, not close
    assert row.reason is not None and row.reason.startswith(
        "cut at another point: A's output flows unchanged into Model.norm inputs.args.0, which agrees with B's")


def test_a_wrong_scale_after_the_call_still_diverges(tmp_path: Path) -> None:
    result = align(tmp_path, Model(scale_inside=False, scale=DIM**0.5 * 1.01))
    assert not result.passed
    assert result.first_divergence is not None
    assert (result.first_divergence.module_path_b, result.first_divergence.tensor_b) == \
        ("Model.embed_tokens", "outputs")


def test_a_wrong_embedding_still_diverges(tmp_path: Path) -> None:
    result = align(tmp_path, Model(scale_inside=False), edit=True)
    assert not result.passed
    assert result.first_divergence is not None and result.first_divergence.module_path_b == "Model.embed_tokens"
