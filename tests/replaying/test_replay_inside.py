"""A call that cannot run alone is judged inside its parent's run on A's inputs (issue 35, contract 1).

The pair cuts the attention as transformers' BLOOM and transformer-lens do: A's ``self_attention`` adds
the residual inside and its output projection ``dense`` takes the attention's result; B's ``attn``
returns the projection only, from its own parameters, and the layer adds the residual. With the BLOOM
hand map, B's ``attn`` pairs with A's ``dense`` on its outputs only: A recorded no call with ``attn``'s
inputs, so ``attn`` runs only inside its layer's run.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import tracediff

X = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(0))
HAND_MAP = {
    "rename": [["^layers\\.(\\d+)\\.self_attention\\.dense$", "layers.\\1.attn"]],
    "slots": [["self_attention\\.dense$", "inputs.args.0", None]],
}


class SelfAttention(nn.Module):
    """A: the residual added inside, after the output projection."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Linear(8, 8)
        self.dense = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual + self.dense(torch.tanh(self.mix(x)))


class LayerA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.self_attention = SelfAttention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.self_attention(self.norm(x), x)


class Attn(nn.Module):
    """B: the same math from its own parameters, without the residual."""

    def __init__(self, source: SelfAttention) -> None:
        super().__init__()
        self.w_mix = nn.Parameter(source.mix.weight.detach().clone())
        self.b_mix = nn.Parameter(source.mix.bias.detach().clone())
        self.w_out = nn.Parameter(source.dense.weight.detach().clone())
        self.b_out = nn.Parameter(source.dense.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.w_mix.T + self.b_mix) @ self.w_out.T + self.b_out


class LayerB(nn.Module):
    def __init__(self, source: LayerA) -> None:
        super().__init__()
        self.norm = source.norm
        self.attn = Attn(source.self_attention)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm(x))


class Reference(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.layers = nn.ModuleList([LayerA(), LayerA()])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class Port(nn.Module):
    def __init__(self, source: Reference) -> None:
        super().__init__()
        self.embed, self.head = source.embed, source.head
        self.layers = nn.ModuleList([LayerB(layer) for layer in source.layers])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def reference() -> nn.Module:
    torch.manual_seed(0)
    model = Reference().eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.norm.weight.uniform_(0.5, 1.5)
    return model


def port(*, o_transposed: bool = False, norm_scaled: bool = False) -> nn.Module:
    model = Port(reference()).eval()
    with torch.no_grad():
        if o_transposed:  # the square output projection of layer 1 copied transposed
            model.layers[1].attn.w_out.copy_(model.layers[1].attn.w_out.T.clone())
        if norm_scaled:
            model.layers[1].norm.weight.mul_(1.1)
    return model


@pytest.fixture
def trace(capture_ref):  # type: ignore[no-untyped-def]
    return capture_ref("residual-inside", reference, X)


def test_a_wrong_call_paired_on_its_outputs_only_is_named_not_its_layer(trace):  # type: ignore[no-untyped-def]
    result = tracediff.replay(port(o_transposed=True), trace, map=HAND_MAP, patch=True)
    assert [c.module_path_b for c in result.culprits] == ["Port.layers.1.attn"]
    assert result.verdict == "diverged" and not result.undecided
    attn = result.culprits[0]
    assert attn.module_path_a == "Reference.layers.1.self_attention.dense" and attn.verdict == "B differs"
    assert attn.reason.startswith("judged inside Port.layers.1's run on A's inputs (it cannot run alone: paired "
                                  "with A's call on its outputs only")
    layer = next(c for c in result.modules if c.module_path_b == "Port.layers.1")
    assert layer.explained_by == ("Port.layers.1.attn",) and not layer.culprit
    assert not any(s.module_path_b.endswith(".attn") for s in result.skipped)
    # A's output in attn's place in B's whole forward leaves only float32 rounding of the final error
    assert attn.patch_effect is not None and attn.patch_effect > 99.0


def test_a_right_call_paired_on_its_outputs_only_is_the_same_math(trace):  # type: ignore[no-untyped-def]
    result = tracediff.replay(port(), trace, map=HAND_MAP)
    assert result.passed and result.verdict == "passed" and not result.undecided
    attn = [c for c in result.modules if c.module_path_b.endswith(".attn")]
    assert [c.verdict for c in attn] == ["same math", "same math"]


def test_in_bf16_the_parents_float64_run_judges_the_call(trace):  # type: ignore[no-untyped-def]
    # atol = rtol = 0 puts every row out of tolerance: each is judged by the float64 oracle, and attn's
    # exact output comes from its layer's float64 run
    result = tracediff.replay(port().to(torch.bfloat16), trace, map=HAND_MAP, atol=0.0, rtol=0.0)
    attn = [c for c in result.modules if c.module_path_b.endswith(".attn")]
    assert len(attn) == 2 and all(c.verdict == "same math" for c in attn)
    assert all(row.factor is not None and row.factor <= tracediff.replaying.NOISE_MULTIPLIER
               for c in attn for row in c.tensors)
    assert result.passed, result.undecided


def test_a_call_is_not_judged_inside_a_run_where_a_call_before_it_differs(trace):  # type: ignore[no-untyped-def]
    # layer 1's norm differs too: attn's inputs inside layer 1's run are not A's, so attn is not judged there
    result = tracediff.replay(port(o_transposed=True, norm_scaled=True), trace, map=HAND_MAP)
    assert [c.module_path_b for c in result.culprits] == ["Port.layers.1.norm"]
    skipped = next(s for s in result.skipped if s.module_path_b == "Port.layers.1.attn")
    assert skipped.reason.endswith("; not judged inside Port.layers.1's run either: Port.layers.1.norm (call 0) "
                                   "ran before it there: B differs")
    assert any(line.startswith("Port.layers.1 (call 0) differs, but Port.layers.1.attn inside it could not be "
                               "judged") for line in result.undecided)


def wrong_port() -> nn.Module:
    """SPEC for the command line: layer 1's output projection transposed."""
    return port(o_transposed=True)


def test_the_command_line_names_the_call_judged_inside_its_layer(trace, tmp_path, capsys):  # type: ignore[no-untyped-def]
    from tracediff.cli.main import main

    hand_map = tmp_path / "map.json"
    hand_map.write_text(json.dumps(HAND_MAP))
    spec = "tests.replaying.test_replay_inside:wrong_port"
    assert main(["replay", str(trace), spec, "--map", str(hand_map), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "diverged" and report["undecided"] == []
    assert [c["module_path_b"] for c in report["culprits"]] == ["Port.layers.1.attn"]
    assert report["culprits"][0]["reason"].startswith("judged inside Port.layers.1's run on A's inputs")


def test_calls_that_take_a_cache_run_alone_and_are_explained_by_the_culprit(capture_ref):  # type: ignore[no-untyped-def]
    # with use_cache=True every decoder layer and attention takes a DynamicCache, known to A's trace only by
    # its repr: each runs alone with the cache B's own forward made (empty, as A's was in its prefill), no
    # longer only inside the model's run; the attention holding a scaled o_proj is explained by it
    from tests.replaying import ports

    trace = capture_ref("llama-with-cache", ports.llama, input_ids=ports.IDS, use_cache=True)
    clean = tracediff.replay(ports.llama(), trace)
    assert clean.passed and clean.skipped == ()
    model = ports.llama()
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.weight.mul_(1.1)
    result = tracediff.replay(model, trace)
    assert [c.module_path_b for c in result.culprits] == ["LlamaForCausalLM.model.layers.1.self_attn.o_proj"]
    attn = next(c for c in result.modules if c.module_path_b == "LlamaForCausalLM.model.layers.1.self_attn")
    assert not attn.reason.startswith("judged inside")
    assert attn.verdict == "B differs" and attn.explained_by == ("LlamaForCausalLM.model.layers.1.self_attn.o_proj",)
    later = next(c for c in result.modules if c.module_path_b == "LlamaForCausalLM.model.layers.2.self_attn")
    assert later.verdict == "same math" and result.skipped == () and result.undecided == ()
