"""A rotary table is never paired with an attention mask because their shapes agree.

The reference (``FusedLlama`` without a mask tensor: its blocks take ``(x, cos, sin)`` by position and attend
causally by ``is_causal``) against transformers' ``LlamaForCausalLM`` with eager attention, whose decoder layers
take ``attention_mask=`` (a float ``[1, 1, T, T]`` of 0 and ``finfo.min``) and ``position_embeddings=(cos, sin)``
(``[1, T, D]`` each). The sequence is as long as a head (``T == D``), so A's ``cos`` ``[T, D]`` and B's mask have
one shape once dimensions of size 1 are dropped. With B's rotary base wrong, ``cos`` no longer agrees with B's
table by value: the first divergence must be named at the rotary tables (or the attention that reads them), in
every pairing mode, never at a mask that A does not have.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.ports.harness import CLEAN, Bug, Port, PortRun, inside
from tests.ports.research import FusedLlama
from tests.ports.test_research_llama import DIM, FFN, GROUPS, HAND_MAP, HEADS, LAYERS, TOKENS, VOCAB, convert, port

pytest.importorskip("transformers")

HEAD_DIM = DIM // HEADS
assert TOKENS.shape[1] == HEAD_DIM  # the case: the table's [T, D] is the mask's [T, T]


def reference() -> nn.Module:
    model = FusedLlama(vocab=VOCAB, layers=LAYERS, dim=DIM, heads=HEADS, groups=GROUPS, hidden=FFN, keep_mask=False)
    with torch.no_grad():  # RMSNorm scales start at one: make them count
        for name, param in model.named_parameters():
            if "norm" in name or "ln_f" in name:
                param.uniform_(0.5, 1.5)
    return model


def rope_base(base: float) -> Callable[[nn.Module], None]:
    """An edit of a transformers decoder's rotary embedding: its inverse frequencies for another base."""
    def edit(model: nn.Module) -> None:
        rotary = model.model.rotary_emb
        inv_freq = 1.0 / (base ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float) / HEAD_DIM))
        rotary.inv_freq.copy_(inv_freq)
        rotary.original_inv_freq.copy_(inv_freq)

    return edit


BUG = Bug("rope-base", "rope_theta 5e5 instead of 1e4", "model.rotary_emb", edit_port=rope_base(5e5))
PORT = Port(name="research_llama_causal", reference=reference, convert=convert, port=port,
            run_reference=lambda model: model(TOKENS), run_port=lambda model: model(input_ids=TOKENS),
            hand_map=HAND_MAP, bugs=(BUG,), replay_bug=BUG.name, ops_bug=BUG.name,
            ops_in=("transformer.h.0.attn", "model.layers.0.self_attn"))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> PortRun:
    return PortRun(PORT, tmp_path_factory.mktemp(PORT.name))


def first_row(run: PortRun, mode: str) -> tuple[int, dict[str, object] | None, str | None]:
    """The exit code, the report's first divergence and its likely source (B's module, relative)."""
    import json

    code, _, _ = run.align(BUG.name, mode)
    written = json.loads((run.root / PORT.name / "report.json").read_text())
    likely = written.get("likely_source")
    return code, written["first_divergence"], likely["module_path_b"].split(".", 1)[1] if likely else None


@pytest.mark.parametrize("mode", ["no map", "suggested map", "hand map"])
def test_the_clean_port_passes(run: PortRun, mode: str) -> None:
    assert run.judge(CLEAN, mode).exit_code == 0


@pytest.mark.parametrize("mode", ["no map", "suggested map", "hand map"])
def test_a_wrong_rotary_base_is_named_at_the_tables_not_at_the_mask(run: PortRun, mode: str) -> None:
    code, first, likely = first_row(run, mode)
    assert code == 1 and first is not None
    assert "mask" not in str(first["tensor"]), first
    module_b = str(first["module_path_b"]).split(".", 1)[1]
    # the tables B's layer 0 takes (or the attention reading them), made by B's rotary embedding
    assert first["tensor"] in ("inputs.kwargs.position_embeddings.0", "inputs.kwargs.position_embeddings.1") or \
        inside(module_b, "model.layers.0.self_attn"), first
    assert likely == "model.rotary_emb"


def test_the_mask_is_left_unpaired_not_compared_with_a_table(run: PortRun) -> None:
    import tracediff

    result = tracediff.align(run.trace("reference"), run.trace(BUG.name))
    assert not [row for row in result.rows if "attention_mask" in row.tensor]
    assert any(u.module_path.endswith("model.layers.0") and u.tensor == "inputs.kwargs.attention_mask"
               for u in result.unmatched_b)
