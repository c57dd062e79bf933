"""torchtune's Phi-3 builder (A), with separate ``q_proj``, ``k_proj``, ``v_proj``, ``w1`` and ``w3``, converted
to transformers' ``Phi3ForCausalLM`` (B) by torchtune's own ``phi3_tune_to_hf``, which fuses them into
``qkv_proj`` and ``gate_up_proj``: the port whose fused side is B, with grouped-query attention.
"""

from __future__ import annotations

import pytest

from tests.ports.harness import (
    INSTALL,
    Bug,
    Port,
    StateDict,
    o_proj_transposed,
    rms_eps,
    spread_scales,
    verdict_tests,
)

pytest.importorskip("torchtune", reason=f"the ports extra is not installed: {INSTALL}")

import torch  # noqa: E402
from torch import nn  # noqa: E402

VOCAB, LAYERS, HEADS, KV_HEADS, DIM, FFN, SEQ = 64, 2, 4, 2, 32, 64, 8
HEAD_DIM = DIM // HEADS
KV_DIM = HEAD_DIM * KV_HEADS
TOKENS = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(3))


def reference() -> nn.Module:
    from torchtune.models.phi3 import phi3

    model = phi3(vocab_size=VOCAB, num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV_HEADS, embed_dim=DIM,
                 intermediate_dim=FFN, max_seq_len=16, norm_eps=1e-5)
    return spread_scales(model)


def convert(model: nn.Module) -> StateDict:
    from torchtune.models.phi3._convert_weights import phi3_tune_to_hf

    return phi3_tune_to_hf(model.state_dict())


def port(state: StateDict) -> nn.Module:
    from transformers import Phi3Config, Phi3ForCausalLM

    config = Phi3Config(
        vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, rms_norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=16, original_max_position_embeddings=16, tie_word_embeddings=False,
        use_cache=False, attn_implementation="eager", pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = Phi3ForCausalLM(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not [key for key in missing if "rotary" not in key], (missing, unexpected)
    return model


def qkv(layer: int) -> str:
    return f"model.layers.{layer}.self_attn.qkv_proj.weight"


def kv_swapped(state: StateDict) -> None:
    """Fused as ``cat([q, v, k])``: the order of a converter that lists the projections alphabetically."""
    q, k, v = state[qkv(0)].split([DIM, KV_DIM, KV_DIM])
    state[qkv(0)] = torch.cat([q, v, k])


def rope_permuted(state: StateDict) -> None:
    """Layer 1's q and k rows permuted as Llama's converters do, although Phi-3's rotary is already half-split."""
    def permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
        return weight.view(heads, HEAD_DIM // 2, 2, DIM).transpose(1, 2).reshape(heads * HEAD_DIM, DIM)

    q, k, v = state[qkv(1)].split([DIM, KV_DIM, KV_DIM])
    state[qkv(1)] = torch.cat([permute(q, HEADS), permute(k, KV_HEADS), v])


def gate_up_swapped(state: StateDict) -> None:
    key = "model.layers.0.mlp.gate_up_proj.weight"
    gate, up = state[key].chunk(2)
    state[key] = torch.cat([up, gate])


BUGS = (
    Bug("kv-swapped", "layer 0's qkv_proj fused as q, v, k", "model.layers.0.self_attn", edit_state=kv_swapped),
    Bug("rope-permuted", "layer 1's q and k rows permuted for an interleaved rotary Phi-3 does not use",
        "model.layers.1.self_attn", edit_state=rope_permuted),
    Bug("gate-up-swapped", "layer 0's gate_up_proj fused as up, gate", "model.layers.0.mlp",
        edit_state=gate_up_swapped),
    Bug("rms-eps", "rms_norm_eps 1e-2 instead of 1e-5 (every layer norm)", "model.layers.0.input_layernorm",
        edit_port=rms_eps(1e-2)),
    o_proj_transposed(1),
)

# Renames only: the fused projections are paired by their layouts (docs/matching.md), with or without a map.
HAND_MAP = {
    "rename": [
        ["^tok_embeddings$", "model.embed_tokens"],
        ["^norm$", "model.norm"],
        ["^output$", "lm_head"],
        ["^layers(?=\\.|$)", "model.layers"],
        ["^(model\\.layers\\.\\d+\\.)attn(?=\\.|$)", "\\1self_attn"],
        ["\\.output_proj$", ".o_proj"],
        ["\\.sa_norm$", ".input_layernorm"],
        ["\\.mlp_norm$", ".post_attention_layernorm"],
        ["\\.mlp\\.w2$", ".mlp.down_proj"],
        ["\\.mlp\\.activation$", ".mlp.activation_fn"],
    ],
}

PORT = Port(
    name="torchtune_phi3",
    reference=reference,
    convert=convert,
    port=port,
    run_reference=lambda model: model(TOKENS),
    run_port=lambda model: model(input_ids=TOKENS),
    hand_map=HAND_MAP,
    bugs=BUGS,
    replay_bug="o-proj-transposed",
    ops_bug="rms-eps",
    ops_in=("layers.0.sa_norm", "model.layers.0.input_layernorm"),
)

WRONG: dict[tuple[str, str], str] = {}


run, test_verdict = verdict_tests(PORT, WRONG)
