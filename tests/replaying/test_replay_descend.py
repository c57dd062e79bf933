"""Replay descends instead of giving up (issue 35, contract 1).

Research-style references (tests/ports/research.py) against their transformers ports: a fused q/k/v
projection, vision patches, a boolean keep-mask against transformers' additive mask. The module that
holds a planted mistake is named, never the layer around it; the float64 oracle runs in one dtype
whatever a module reads at call time; and a replay in which a call that could not be judged may hold the
mistake is undecided, never passed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff
from tests.ports.research import FusedLlama, PatchViT, fused_llama_to_hf, patch_vit_to_hf

IDS = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(3))
IMAGES = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(3))


def fused_llama() -> nn.Module:
    torch.manual_seed(0)
    model = FusedLlama(vocab=64, layers=2, dim=32, heads=4, groups=2, hidden=64).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "ln_f" in name:
                param.uniform_(0.5, 1.5)
    return model


def llama_port(reference: nn.Module, attn: str, *, kv_swapped_in: int | None = None, use_cache: bool = False
               ) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    state = fused_llama_to_hf(reference.state_dict(), heads=4, groups=2, dim=32)
    if kv_swapped_in is not None:
        k, v = (f"model.layers.{kv_swapped_in}.self_attn.{p}_proj.weight" for p in "kv")
        state[k], state[v] = state[v].clone(), state[k].clone()
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
                         max_position_embeddings=16, tie_word_embeddings=False, use_cache=use_cache,
                         attn_implementation=attn)
    model = LlamaForCausalLM(config).eval()
    model.load_state_dict(state, strict=False)
    return model


def vit() -> nn.Module:
    torch.manual_seed(0)
    return PatchViT(image=16, patch=4, channels=3, dim=32, layers=3, heads=4, hidden=64).eval()


def vit_port(reference: nn.Module, *, qk_swapped_in: int) -> nn.Module:
    from transformers import ViTConfig, ViTModel

    state = patch_vit_to_hf(reference.state_dict(), dim=32)
    for kind in ("weight", "bias"):
        q, k = (f"layers.{qk_swapped_in}.attention.{p}_proj.{kind}" for p in "qk")
        state[q], state[k] = state[k].clone(), state[q].clone()
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=3,
                       num_attention_heads=4, intermediate_size=64, attn_implementation="sdpa")
    model = ViTModel(config, add_pooling_layer=False).eval()
    model.load_state_dict(state, strict=False)
    return model


def test_vit_with_q_and_k_swapped_names_the_attention_not_the_layer(capture_ref):  # type: ignore[no-untyped-def]
    # the attention returns (output, weights) where the reference's returns a tensor: paired as align pairs them
    trace = capture_ref("patch-vit", vit, IMAGES)
    result = tracediff.replay(vit_port(vit(), qk_swapped_in=2), trace)
    assert [c.module_path_b for c in result.culprits] == ["ViTModel.layers.2.attention"]
    assert result.verdict == "diverged"
    attention = [c for c in result.modules if c.module_path_b.endswith(".attention")]
    assert len(attention) == 3 and all(c.verdict != "not comparable" for c in attention)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_fused_qkv_llama_with_k_and_v_swapped_names_that_layers_attention(capture_ref, attn):  # type: ignore[no-untyped-def]
    # eager: B's attention takes an additive mask where the reference passed a boolean keep-mask; A's mask
    # is written in B's convention, so layer 0's attention is the same math
    trace = capture_ref("fused-llama", fused_llama, IDS)
    result = tracediff.replay(llama_port(fused_llama(), attn, kv_swapped_in=1), trace)
    assert [c.module_path_b for c in result.culprits] == ["LlamaForCausalLM.model.layers.1.self_attn"]
    layer0 = next(c for c in result.modules if c.module_path_b == "LlamaForCausalLM.model.layers.0.self_attn")
    assert layer0.verdict == "same math"


def test_clean_fused_qkv_llama_passes(capture_ref):  # type: ignore[no-untyped-def]
    trace = capture_ref("fused-llama", fused_llama, IDS)
    result = tracediff.replay(llama_port(fused_llama(), "eager"), trace)
    assert result.passed and result.verdict == "passed", result.undecided


class TableHead(nn.Module):
    """A projection read through a table kept in a plain attribute, made at the first call (as rotary
    embeddings cache their tables): ``.to(float64)`` does not convert it."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.top = 1.5
        self._table: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._table is None:
            self._table = torch.linspace(0.5, self.top, 64).reshape(8, 8)
        return self.proj(x) @ self._table


class TableNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = TableHead()
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.full((8, 8), 0.25)  # made in float32 at call time, passed down
        return self.out(self.head(x) @ scale)


def table_net(bug: bool = False) -> nn.Module:
    torch.manual_seed(0)
    model = TableNet().eval()
    if bug:
        model.head.top = 1.6  # the mistake: a table made otherwise
    return model


def test_the_float64_oracle_casts_tables_read_at_call_time(capture_ref):  # type: ignore[no-untyped-def]
    trace = capture_ref("table-net", table_net, torch.randn(2, 8, generator=torch.Generator().manual_seed(0)))
    model = table_net(bug=True)
    result = tracediff.replay(model, trace)
    assert [c.module_path_b for c in result.culprits] == ["TableNet.head"]
    head = next(c for c in result.modules if c.module_path_b == "TableNet.head")
    assert head.verdict == "B differs" and head.worst is not None and head.worst.factor is not None
    root = next(c for c in result.modules if c.module_path_b == "TableNet")
    assert root.verdict == "B differs" and root.explained_by == ("TableNet.head",)
    assert model.head._table is not None and model.head._table.dtype == torch.float32  # B itself untouched


class Armed(nn.Module):
    """A module that runs only when its parent arms it: it cannot be replayed alone."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.armed:
            raise RuntimeError("called outside its parent")
        return torch.tanh(x) * 2.0


class ArmedNet(nn.Module):
    def __init__(self, factor: float = 2.0) -> None:
        super().__init__()
        self.inner = Armed()
        self.after = nn.Linear(8, 8)
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inner.armed = True
        try:
            y = self.inner(x)
        finally:
            self.inner.armed = False
        return self.after(y)


class WrongArmed(Armed):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.armed:
            raise RuntimeError("called outside its parent")
        return torch.tanh(x) * 2.5  # the mistake, in a module that cannot run alone


def armed_net(wrong: bool = False) -> nn.Module:
    torch.manual_seed(0)
    model = ArmedNet().eval()
    if wrong:
        model.inner = WrongArmed()
    return model


def test_a_difference_around_a_call_that_cannot_run_is_undecided(capture_ref, tmp_path: Path):  # type: ignore[no-untyped-def]
    trace = capture_ref("armed-net", armed_net, torch.randn(2, 8, generator=torch.Generator().manual_seed(0)))
    result = tracediff.replay(armed_net(wrong=True), trace)
    inner = next(c for c in result.modules if c.module_path_b == "ArmedNet.inner")
    assert inner.verdict == "not comparable" and "called outside its parent" in inner.reason
    assert not result.culprits and not result.passed and result.verdict == "undecided"
    assert result.undecided == (
        "ArmedNet (call 0) differs, but ArmedNet.inner inside it could not be judged (B's module raised "
        "RuntimeError: called outside its parent on A's inputs): the mistake may be there",)
    assert result.to_dict()["verdict"] == "undecided"


def test_a_replay_with_a_call_nothing_vouches_for_never_passes(capture_ref):  # type: ignore[no-untyped-def]
    trace = capture_ref("armed-net", armed_net, torch.randn(2, 8, generator=torch.Generator().manual_seed(0)))
    result = tracediff.replay(armed_net(), trace, modules=["inner", "after"])
    assert [c.verdict for c in result.modules] == ["not comparable", "same math"]
    assert not result.passed and result.verdict == "undecided"
    assert result.undecided[0].startswith("ArmedNet.inner (call 0) could not be judged (")
    # the whole model replayed: the root is the same math and vouches for the call it ran
    assert tracediff.replay(armed_net(), trace).passed


def wrong_armed_net() -> nn.Module:
    """SPEC for the command line: the mistake inside a module that cannot run alone."""
    return armed_net(wrong=True)


def test_an_undecided_replay_exits_1_and_says_why(capture_ref, capsys):  # type: ignore[no-untyped-def]
    from tracediff.cli.main import main

    trace = capture_ref("armed-net", armed_net, torch.randn(2, 8, generator=torch.Generator().manual_seed(0)))
    assert main(["replay", str(trace), "tests.replaying.test_replay_descend:wrong_armed_net"]) == 1
    out = capsys.readouterr().out
    assert "UNDECIDED: no culprit, but calls that could not be judged may hold the mistake:" in out
    assert "  ArmedNet (call 0) differs, but ArmedNet.inner inside it could not be judged" in out


def test_a_call_paired_on_its_outputs_only_is_judged_inside_its_parents_run(capture_ref):  # type: ignore[no-untyped-def]
    from tests.replaying import ports

    trace = capture_ref("toy-net", ports.net, torch.randn(2, 4, generator=torch.Generator().manual_seed(0)))
    # the map sets blocks.1's inputs aside: it pairs on its outputs only and cannot run alone; Net's run on
    # A's inputs runs it after embed and blocks.0, both the same math
    setting_aside = {"slots": [["^blocks\\.1$", "inputs", None]]}
    result = tracediff.replay(ports.net(ports.LeakyResidualBlock), trace, map=setting_aside)
    assert not any(s.module_path_b == "Net.blocks.1" for s in result.skipped)
    assert [c.module_path_b for c in result.culprits] == ["Net.blocks.1"] and result.verdict == "diverged"
    assert result.culprits[0].reason.startswith("judged inside Net's run on A's inputs (it cannot run alone: "
                                                "paired with A's call on its outputs only")


def test_a_difference_around_a_call_paired_on_its_outputs_only_is_undecided(capture_ref):  # type: ignore[no-untyped-def]
    from tests.replaying import ports

    trace = capture_ref("toy-net", ports.net, torch.randn(2, 4, generator=torch.Generator().manual_seed(0)))
    setting_aside = {"slots": [["^blocks\\.1$", "inputs", None]]}
    model = ports.net(ports.LeakyResidualBlock)
    with torch.no_grad():
        model.blocks[0].fc.weight.mul_(1.1)  # blocks.1's inputs in Net's run are not A's: it cannot be judged there
    result = tracediff.replay(model, trace, map=setting_aside)
    skipped = next(s for s in result.skipped if s.module_path_b == "Net.blocks.1")
    assert skipped.reason.endswith("; not judged inside Net's run either: Net.blocks.0 (call 0) ran before it "
                                   "there: B differs")
    assert [c.module_path_b for c in result.culprits] == ["Net.blocks.0.fc"]
    assert result.undecided[0].startswith("Net (call 0) differs, but Net.blocks.1 inside it could not be judged "
                                          "(not replayed: paired with A's call on its outputs only")
