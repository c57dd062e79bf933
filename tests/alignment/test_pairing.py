"""Pairing with zero options: top down, values first, one decision per repeated structure.

A research-style Llama (fused ``qkv`` and ``gate_up``, rotary tables inside each attention, its own names,
two wrapper levels) against transformers' ``LlamaModel`` holding the same weights, with no map: the clean
port passes, a planted bug is named at its module, the suggested map gives back the same pairing, and every
row says what its pair rests on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.alignment.helpers import INPUT_IDS, capture, llama, perturb, run_cli
from tests.alignment.research_models import from_llama
from tracediff import align, load_trace
from tracediff.alignment.pairing.calls import match_nodes

LAYERS = 3


class _Trunk(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.trunk = inner

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.trunk(idx)


class Wrapped(nn.Module):
    """``backbone.trunk.blocks.N``: two wrapper levels transformers' ``layers.N`` does not have."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.backbone = _Trunk(inner)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.backbone(idx)


class WithNoOp(nn.Module):
    """A projection behind an ``nn.Identity`` (a ViT block's optional norm) of the same size."""

    def __init__(self, no_op: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm = nn.Identity() if no_op else None
        self.q_proj = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            x = self.norm(x)
        return self.out(torch.relu(self.q_proj(x)))


def _kv_swapped(layer: int) -> nn.Module:
    model = llama(layers=LAYERS)
    attention = model.layers[layer].self_attn
    with torch.no_grad():
        k, v = attention.k_proj.weight.clone(), attention.v_proj.weight.clone()
        attention.k_proj.weight.copy_(v)  # grouped-query attention: k and v have the same shape
        attention.v_proj.weight.copy_(k)
    return model


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pairing")
    x = torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(3))
    return {
        "research": capture(Wrapped(from_llama(llama(layers=LAYERS))), INPUT_IDS, root / "research"),
        "clean": capture(llama(layers=LAYERS), INPUT_IDS, root / "clean"),
        "kv-swapped": capture(_kv_swapped(2), INPUT_IDS, root / "kv-swapped"),
        "down": capture(perturb(llama(layers=LAYERS), "layers.1.mlp.down_proj.weight", 0.05), INPUT_IDS,
                        root / "down"),
        "no-op": capture(WithNoOp(True), x, root / "no-op"),
        "plain": capture(WithNoOp(False), x, root / "plain"),
    }


def test_a_clean_port_with_other_names_and_wrapper_levels_passes_with_no_options(traces: dict[str, Path]) -> None:
    result = align(traces["research"], traces["clean"])
    assert result.passed, result.first_divergence
    paired = {(row.module_path_a, row.module_path_b) for row in result.rows}
    assert ("Wrapped.backbone.trunk.blocks.2.attn.proj", "LlamaModel.layers.2.self_attn.o_proj") in paired
    # no pair crosses two layers: the instance numbers agree on every row
    assert all(a.split(".")[4] == b.split(".")[2] for a, b in paired if ".blocks." in a and ".layers." in b)


def test_a_bug_in_one_layer_is_named_at_its_module(traces: dict[str, Path]) -> None:
    first = align(traces["research"], traces["down"]).first_divergence
    assert first is not None and first.module_path_b == "LlamaModel.layers.1.mlp.down_proj"
    assert first.tensor == "outputs" and first.pairing == "value"


def test_k_and_v_swapped_in_one_layer_is_not_absorbed_by_the_fused_layout(traces: dict[str, Path]) -> None:
    """The slice order of the fused qkv is decided across all layers: layer 2's swap is its divergence."""
    result = align(traces["research"], traces["kv-swapped"])
    first = result.first_divergence
    assert first is not None and first.module_path_b == "LlamaModel.layers.2.self_attn.k_proj"
    assert first.transform == "A[..., 32:48] ~ B"  # the order every other layer follows
    others = [row for row in result.rows if row.module_path_b.endswith("self_attn.k_proj") and row.transform]
    assert {row.transform for row in others} == {"A[..., 32:48] ~ B"} and len(others) == LAYERS


def test_the_suggested_map_gives_back_the_same_pairing(traces: dict[str, Path]) -> None:
    found = align(traces["research"], traces["clean"])
    rules = [list(rule) for rule in found.suggested_rename]
    assert rules and len(rules) < 12  # one rule per renamed level, for every layer at once
    assert not any(r"\d" in pattern.replace(r"\d+", "") for pattern, _ in rules)  # no rule names one layer
    again = align(traces["research"], traces["clean"], map={"rename": rules})
    assert again.passed
    assert {(r.module_path_a, r.module_path_b, r.tensor) for r in again.rows} == \
        {(r.module_path_a, r.module_path_b, r.tensor) for r in found.rows}
    assert {row.pairing for row in again.rows if row.matched_by != "layout"} <= {"map", "name"}


def test_a_no_op_module_is_never_paired_with_a_module_that_computes(traces: dict[str, Path]) -> None:
    matching = match_nodes(load_trace(traces["no-op"]), load_trace(traces["plain"]), [])
    pairs = {(a.relative_path, b.relative_path) for a, b in matching.pairs}
    assert ("q_proj", "q_proj") in pairs and ("out", "out") in pairs
    assert not any("norm" in a for a, _ in pairs)
    assert [node.relative_path for node in matching.unmatched_a] == ["norm"]
    assert align(traces["no-op"], traces["plain"]).passed


def test_rows_say_what_their_pair_rests_on(traces: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    table = align(traces["research"], traces["clean"]).table
    assert set(table["pairing"]) <= {"map", "value", "name", "shape"} and "value" in set(table["pairing"])
    assert (table.loc[table["module_path_b"] == "LlamaModel", "pairing"] == "name").all()  # the roots
    code, _, _ = run_cli(["align", str(traces["research"]), str(traces["clean"]), "--format", "json", "--output",
                          str(tmp_path / "report.json")], capsys)
    rows = json.loads((tmp_path / "report.json").read_text())["rows"]
    assert code == 0 and {row["pairing"] for row in rows} == set(table["pairing"])


def test_a_hand_map_is_honoured_under_auto_and_combined_with_layouts(traces: dict[str, Path]) -> None:
    rules = [[r"^backbone\.trunk\.", ""], [r"^blocks(?=\.|$)", "layers"], [r"^(layers\.\d+\.)attn(?=\.|$)",
                                                                             r"\1self_attn"]]
    result = align(traces["research"], traces["kv-swapped"], map={"rename": rules})
    first = result.first_divergence
    assert first is not None and first.module_path_b == "LlamaModel.layers.2.self_attn.k_proj"
    attention = [r for r in result.rows if r.module_path_b == "LlamaModel.layers.0.self_attn"]
    assert attention and {r.pairing for r in attention} == {"map"}


def test_a_mistake_no_recorded_pair_can_hold_is_said_to_be_undecided(tmp_path: Path) -> None:
    """The rotary tables: computed inside each attention in A, by the model's own call in B, which has no
    partner; a wrong base first shows inside the attention, and the report names the unpaired calls."""
    port = llama(layers=LAYERS)
    with torch.no_grad():
        port.rotary_emb.inv_freq.mul_(0.5)
    reference = capture(from_llama(llama(layers=LAYERS)), INPUT_IDS, tmp_path / "a")
    result = align(reference, capture(port, INPUT_IDS, tmp_path / "b"))
    first = result.first_divergence
    assert first is not None and first.origin == "between modules"
    said = [w for w in result.warnings if w.startswith("the first divergence arose between recorded calls")]
    assert len(said) == 1 and "LlamaModel.rotary_emb" in said[0] and "cannot decide" in said[0]
