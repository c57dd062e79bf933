"""torchtune's Qwen2 builder (A), with biased ``q``/``k``/``v`` projections and the output tied to the token
embedding, converted to transformers' ``Qwen2ForCausalLM`` (B) by torchtune's own ``qwen2_tune_to_hf``, which
leaves the tied ``lm_head.weight`` out of the state dict.
"""

from __future__ import annotations

import pytest

from tests.ports.harness import (
    INSTALL,
    TORCHTUNE_RENAMES,
    Bug,
    Port,
    StateDict,
    o_proj_transposed,
    rms_eps,
    spread_scales,
    swap,
    verdict_tests,
)

pytest.importorskip("torchtune", reason=f"the ports extra is not installed: {INSTALL}")

import torch  # noqa: E402
from torch import nn  # noqa: E402

VOCAB, LAYERS, HEADS, KV_HEADS, DIM, FFN, SEQ = 64, 2, 4, 2, 32, 64, 8
TOKENS = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(3))


def reference() -> nn.Module:
    from torchtune.models.qwen2 import qwen2

    model = qwen2(vocab_size=VOCAB, num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV_HEADS, embed_dim=DIM,
                  intermediate_dim=FFN, max_seq_len=16, norm_eps=1e-6, tie_word_embeddings=True)
    return spread_scales(model, biases=True)


def convert(model: nn.Module) -> StateDict:
    from torchtune.models.qwen2._convert_weights import qwen2_tune_to_hf

    return qwen2_tune_to_hf(model.state_dict(), num_heads=HEADS, num_kv_heads=KV_HEADS, dim=DIM,
                            tie_word_embeddings=True)


def port(state: StateDict) -> nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=16, tie_word_embeddings=True, use_cache=False, attn_implementation="eager")
    model = Qwen2ForCausalLM(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not [key for key in missing if "rotary" not in key and key != "lm_head.weight"], (
        missing, unexpected)
    return model


def untied(model: nn.Module) -> None:
    """An output head of its own, as a port built with ``tie_word_embeddings=False`` from this state dict has."""
    generator = torch.Generator().manual_seed(1)
    model.lm_head.weight = nn.Parameter(torch.randn(VOCAB, DIM, generator=generator) * 0.02)


def kv_swapped(state: StateDict, attention: str) -> None:
    for kind in ("weight", "bias"):
        swap(state, f"{attention}.k_proj.{kind}", f"{attention}.v_proj.{kind}")


BUGS = (
    Bug("q-bias-dropped", "layer 0's q_proj bias not copied (left at zero)", "model.layers.0.self_attn.q_proj",
        edit_state=lambda s: s.__setitem__("model.layers.0.self_attn.q_proj.bias",
                                           torch.zeros_like(s["model.layers.0.self_attn.q_proj.bias"]))),
    Bug("kv-swapped", "layer 1's k_proj and v_proj (weights and biases) swapped", "model.layers.1.self_attn",
        edit_state=lambda s: kv_swapped(s, "model.layers.1.self_attn")),
    Bug("output-untied", "lm_head not tied to the token embedding (left as initialized)", "lm_head",
        edit_port=untied),
    Bug("rms-eps", "rms_norm_eps 1e-2 instead of 1e-6 (every layer norm)", "model.layers.0.input_layernorm",
        edit_port=rms_eps(1e-2)),
    o_proj_transposed(1),
)

HAND_MAP = {
    "rename": TORCHTUNE_RENAMES,
}

PORT = Port(
    name="torchtune_qwen2",
    reference=reference,
    convert=convert,
    port=port,
    run_reference=lambda model: model(TOKENS),
    run_port=lambda model: model(input_ids=TOKENS),
    hand_map=HAND_MAP,
    bugs=BUGS,
    replay_bug="q-bias-dropped",
    ops_bug="rms-eps",
    ops_in=("layers.0.sa_norm", "model.layers.0.input_layernorm"),
)

WRONG: dict[tuple[str, str], str] = {}


run, test_verdict = verdict_tests(PORT, WRONG)
