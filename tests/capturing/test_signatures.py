"""``forward_parameters`` in the metadata: the names of each module class's ``forward`` parameters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tracediff
from tracediff import format as fmt
from tracediff.capturing.signatures import forward_parameters


class Attention(nn.Module):
    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, /, sin: torch.Tensor, *rest: Any,
                mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        return hidden * cos + sin


class KeywordOnly(nn.Module):
    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        return x * scale


def _other_attention() -> type[nn.Module]:
    class Attention(nn.Module):  # the same class name, other parameters
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    return Attention


class Model(nn.Module):
    def __init__(self, clash: bool = False) -> None:
        super().__init__()
        self.attn = Attention()
        self.scaled = KeywordOnly()
        self.other = _other_attention()() if clash else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.other(self.scaled(self.attn(x, x, x), scale=2.0))


def test_names_follow_python_signatures() -> None:
    table = forward_parameters(Model())
    assert table["Attention"] == ["hidden", "cos", "sin", "*rest", "mask", "**kwargs"]
    assert table["KeywordOnly"] == ["x", "*", "scale"]
    assert table["Model"] == ["x"] and table["Identity"] == ["input"]


def test_a_class_name_with_two_signatures_is_left_out() -> None:
    assert "Attention" not in forward_parameters(Model(clash=True))


def test_a_capture_writes_them_and_a_trace_reads_them_back(tmp_path: Path) -> None:
    model = Model()
    with torch.no_grad(), tracediff.capture(model, tmp_path / "t"):
        model(torch.ones(2))
    metadata = json.loads((tmp_path / "t" / fmt.METADATA_FILE).read_text())
    assert metadata["forward_parameters"]["KeywordOnly"] == ["x", "*", "scale"]
    trace = tracediff.load_trace(tmp_path / "t")
    attn = next(node for node in trace.nodes() if node.module_type == "Attention")
    assert [fmt.positional_parameter(trace.forward_parameters(attn) or (), i) for i in range(4)] == [
        "hidden", "cos", "sin", None]
