"""Two implementations that cut a block into modules differently (transformers' BLOOM against transformer-lens).

The reference adds the residual inside its attention module, whose output projection ``dense`` takes the
attention's result; the port's ``attn`` takes the normed hidden state, returns the projection alone, and its
norm is called once for each of q, k and v. ``dense`` and ``attn`` pair on their outputs only, the repeated
norm calls compute nothing new, and a bug in the port's attention is named at ``attn``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff
from tracediff.alignment.pairing.evidence import name_similarity
from tracediff.cli.main import main as cli_main

DIM, HEADS = 16, 2


class Attention(nn.Module):
    """Reference attention: q/k/v from one fused projection, the output projection, the residual added inside."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.dense = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        context = _attend(q, k, v)
        return residual + self.dense(context)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(DIM)
        self.self_attention = Attention()
        self.post_attention_layernorm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.self_attention(self.input_layernorm(x), x)
        return x + self.down(torch.relu(self.up(self.post_attention_layernorm(x))))


class PortAttention(nn.Module):
    """Port attention: the same maths from its q, k and v inputs, no residual; a module with no submodule."""

    def __init__(self) -> None:
        super().__init__()
        self.w_q, self.w_k, self.w_v = (nn.Parameter(torch.empty(DIM, DIM)) for _ in range(3))
        self.b_q, self.b_k, self.b_v = (nn.Parameter(torch.empty(DIM)) for _ in range(3))
        self.w_o, self.b_o = nn.Parameter(torch.empty(DIM, DIM)), nn.Parameter(torch.empty(DIM))

    def forward(self, query_input: torch.Tensor, key_input: torch.Tensor, value_input: torch.Tensor) -> torch.Tensor:
        q = nn.functional.linear(query_input, self.w_q, self.b_q)
        k = nn.functional.linear(key_input, self.w_k, self.b_k)
        v = nn.functional.linear(value_input, self.w_v, self.b_v)
        return nn.functional.linear(_attend(q, k, v), self.w_o, self.b_o)


class PortBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.attn = PortAttention()
        self.ln2 = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), self.ln1(x), self.ln1(x))
        return x + self.down(torch.relu(self.up(self.ln2(x))))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    split = [t.unflatten(-1, (HEADS, DIM // HEADS)).transpose(-2, -3) for t in (q, k, v)]
    return nn.functional.scaled_dot_product_attention(*split, is_causal=True).transpose(-2, -3).flatten(-2)


class Reference(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.h = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.h:
            x = block(x)
        return x


class Port(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(PortBlock() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _converted(reference: Reference, *, qk_swapped_in: int | None = None) -> Port:
    port = Port()
    with torch.no_grad():
        for i, (a, b) in enumerate(zip(reference.h, port.blocks)):
            b.ln1.load_state_dict(a.input_layernorm.state_dict())
            b.ln2.load_state_dict(a.post_attention_layernorm.state_dict())
            b.up.load_state_dict(a.up.state_dict())
            b.down.load_state_dict(a.down.state_dict())
            w, bias = a.self_attention.qkv.weight.chunk(3), a.self_attention.qkv.bias.chunk(3)
            order = (1, 0, 2) if i == qk_swapped_in else (0, 1, 2)
            for name, j in zip("qkv", order):
                getattr(b.attn, f"w_{name}").copy_(w[j])
                getattr(b.attn, f"b_{name}").copy_(bias[j])
            b.attn.w_o.copy_(a.self_attention.dense.weight)
            b.attn.b_o.copy_(a.self_attention.dense.bias)
    return port


def _traces(tmp_path: Path, **bug: int) -> tuple[Path, Path]:
    torch.manual_seed(0)
    reference = Reference().eval()
    with torch.no_grad():
        for module in reference.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    port = _converted(reference, **bug).eval()
    x = torch.randn(1, 6, DIM, generator=torch.Generator().manual_seed(1))
    for model, folder in ((reference, tmp_path / "a"), (port, tmp_path / "b")):
        with torch.no_grad(), tracediff.capture(model, folder):
            model(x)
    return tmp_path / "a", tmp_path / "b"


def test_the_clean_port_passes_with_the_projections_compared_on_their_outputs(tmp_path: Path) -> None:
    result = tracediff.align(*_traces(tmp_path))
    assert result.passed, result.first_divergence
    attn = [(r.module_path_a, r.tensor) for r in result.rows if r.module_path_b == "Port.blocks.0.attn"]
    assert attn == [("Reference.h.0.self_attention.dense", "outputs")]
    assert result.suggested_slots == ((r"^h\.\d+\.self_attention\.dense$", "inputs", ""),)
    # the norm's second and third calls (same input, same output) compute nothing new: the first one pairs
    assert {(r.module_path_a, r.call_index_b) for r in result.rows if r.module_path_b == "Port.blocks.0.ln1"} == {
        ("Reference.h.0.input_layernorm", 0)}


def test_a_bug_in_the_port_attention_is_named_at_its_attention(tmp_path: Path) -> None:
    first = tracediff.align(*_traces(tmp_path, qk_swapped_in=0)).first_divergence
    assert first is not None and first.module_path_b == "Port.blocks.0.attn"


def test_the_suggested_map_compares_what_the_pairing_compared(tmp_path: Path) -> None:
    a, b = _traces(tmp_path)
    suggested = tmp_path / "map.json"
    assert cli_main(["align", str(a), str(b), "--suggest-map", str(suggested), "--format", "json",
                     "--output", str(tmp_path / "r.json")]) == 0
    written = json.loads(suggested.read_text())
    assert written["slots"] == [[r"^h\.\d+\.self_attention\.dense$", "inputs", None]]
    assert tracediff.align(a, b, map=str(suggested)).passed
    assert tracediff.align(a, b, map=str(suggested), match="name").passed


@pytest.mark.parametrize(("one", "other", "similarity"), [
    ("attn", "attention", 1.0), ("out_proj", "output_projection", 1.0),
    ("self_attn", "attention", 0.0),  # a word and another word's abbreviation: not one name
    ("self", "self_attn", 0.5), ("mlp", "mlp_norm", 0.5), ("dense", "dropout", 0.0), ("ln", "layernorm", 0.0),
])
def test_a_name_and_its_abbreviation_are_one_name(one: str, other: str, similarity: float) -> None:
    assert name_similarity(one, other) == similarity == name_similarity(other, one)



class Twice(nn.Module):
    """Calls its norm twice: on the same values in layer 0, on twice the values in layer 1 (the same result:
    a LayerNorm does not see the scale)."""

    def __init__(self, same: bool) -> None:
        super().__init__()
        self.same = same
        self.norm = nn.LayerNorm(DIM)
        self.lin = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.norm(x) + self.norm(x if self.same else 2 * x))


class Once(nn.Module):
    """The same block, its norm called once."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.lin = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        return self.lin(y + y)


class Wrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(Twice(same=i == 0)) for i in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class Flat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Once() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_instances_whose_calls_differ_once_opened_still_align(tmp_path: Path) -> None:
    """Opened, layer 0's wrapper holds two calls that compute (its second norm call adds nothing) and layer 1's
    three: the instances no longer line up as one, and that opening is not taken."""
    torch.manual_seed(0)
    reference, port = Wrapped().eval(), Flat().eval()
    for wrapped, flat in zip(reference.layers, port.blocks):
        flat.load_state_dict(wrapped[0].state_dict())
    x = torch.randn(1, 6, DIM, generator=torch.Generator().manual_seed(2))
    for model, folder in ((reference, tmp_path / "a"), (port, tmp_path / "b")):
        with torch.no_grad(), tracediff.capture(model, folder):
            model(x)
    result = tracediff.align(tmp_path / "a", tmp_path / "b")
    assert result.passed, result.first_divergence
