"""An output that B makes in a call with no partner in A is compared at that call (pairing/producers.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import tracediff

VOCAB, DIM = 16, 8


class TiedReference(nn.Module):
    """Logits from the token embedding in the model's own code (no output module), as torchtune ties them."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.norm = nn.LayerNorm(DIM)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.norm(self.embed(tokens)), self.embed.weight)


class HeadPort(nn.Module):
    """The same model with an ``lm_head`` module, then a dropout (in eval mode it returns its input)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.drop = nn.Dropout(0.1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.drop(self.lm_head(self.norm(self.embed(tokens))))


def _traces(tmp_path: Path, *, tied: bool, tensors: str = "full") -> tuple[Path, Path]:
    torch.manual_seed(0)
    reference, port = TiedReference().eval(), HeadPort().eval()
    port.load_state_dict(reference.state_dict(), strict=False)
    if tied:
        port.lm_head.weight = reference.embed.weight
    tokens = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    for model, folder in ((reference, tmp_path / "a"), (port, tmp_path / "b")):
        with torch.no_grad(), tracediff.capture(model, folder, tensors=tensors):  # type: ignore[arg-type]
            model(tokens)
    return tmp_path / "a", tmp_path / "b"


def test_a_wrong_head_with_no_partner_is_named_at_the_head(tmp_path: Path) -> None:
    result = tracediff.align(*_traces(tmp_path, tied=False))
    first = result.first_divergence
    assert first is not None and first.module_path_b == "HeadPort.lm_head" and first.tensor == "outputs"
    assert first.module_path_a == "TiedReference" and first.matched_by == "output" and first.origin == "introduced"
    assert "HeadPort.lm_head" not in {u.module_path for u in result.unmatched_b if u.tensor is None}
    # the dropout returns the head's output as it is: it computes nothing, and gets no row
    assert not [row for row in result.rows if row.module_path_b == "HeadPort.drop"]


def test_the_right_head_passes_and_is_compared(tmp_path: Path) -> None:
    result = tracediff.align(*_traces(tmp_path, tied=True))
    assert result.passed
    assert [row.tensor for row in result.rows if row.module_path_b == "HeadPort.lm_head"] == ["outputs"]


def test_without_payloads_the_value_is_known_by_its_statistics(tmp_path: Path) -> None:
    result = tracediff.align(*_traces(tmp_path, tied=False, tensors="summary"))
    first = result.first_divergence
    assert first is not None and first.module_path_b == "HeadPort.lm_head"
