"""Unpaired producers are named (issue 35, contract 3): when the first divergence is fed by a call of B with
no partner in A (transformers' ``rotary_emb`` against tables a research model computes in its own code),
the verdict names that call as the likely source, with the evidence, and the JSON says so."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

import tracediff
from tests.replaying.test_replay_descend import IDS, fused_llama, llama_port
from tracediff.cli.main import main as cli_main


def port_with_rope_theta(theta: float) -> nn.Module:
    """The fused-qkv Llama's transformers port, its rotary tables made with another base."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    model = llama_port(fused_llama(), "eager")
    model.config.rope_parameters = {"rope_type": "default", "rope_theta": theta}
    model.model.rotary_emb = LlamaRotaryEmbedding(config=model.config)
    return model


def traces(tmp_path: Path, theta: float) -> tuple[Path, Path]:
    reference, port = fused_llama(), port_with_rope_theta(theta)
    with torch.no_grad(), tracediff.capture(reference, tmp_path / "a"):
        reference(IDS)
    with torch.no_grad(), tracediff.capture(port, tmp_path / "b"):
        port(input_ids=IDS)
    return tmp_path / "a", tmp_path / "b"


def test_a_wrong_rotary_table_names_the_unpaired_rotary_emb(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    a, b = traces(tmp_path, 500000.0)
    result = tracediff.align(a, b)
    first = result.first_divergence
    # the boolean keep-mask and transformers' additive mask pair as masks, and are the same mask
    mask = next(r for r in result.rows if r.module_path_b == "LlamaForCausalLM.model.layers.0"
                and r.tensor == "inputs.kwargs.attention_mask")
    assert mask.status == "identical" and "the same mask in other conventions" in mask.reason
    assert first is not None and first.tensor == "inputs.kwargs.position_embeddings.0"
    assert first.origin == "between modules"
    source = result.likely_source
    assert source is not None and source.module_path_b == "LlamaForCausalLM.model.rotary_emb"
    assert source.evidence[0].startswith("LlamaForCausalLM.model.rotary_emb outputs.0 is "
                                         "LlamaForCausalLM.model.layers.0 inputs.kwargs.position_embeddings.0 "
                                         "(diverged, max_abs_err ")
    assert cli_main(["align", str(a), str(b), "--format", "json", "-o", str(tmp_path / "r.json")]) == 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["likely_source"]["module_path_b"] == "LlamaForCausalLM.model.rotary_emb"
    assert cli_main(["align", str(a), str(b)]) == 1
    assert "LIKELY SOURCE: LlamaForCausalLM.model.rotary_emb (call 0)" in capsys.readouterr().out


def test_a_clean_port_has_no_likely_source(tmp_path: Path) -> None:
    a, b = traces(tmp_path, 10000.0)
    result = tracediff.align(a, b)
    assert result.passed and result.likely_source is None
    assert result.to_dict()["likely_source"] is None
