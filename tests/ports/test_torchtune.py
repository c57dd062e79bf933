"""torchtune's Llama 3 builder (A) converted to transformers' ``LlamaForCausalLM`` (B) by torchtune's own
checkpoint conversion, ``torchtune.models.convert_weights.tune_to_hf``, which permutes the rows of
``q_proj`` and ``k_proj`` from torchtune's interleaved rotary layout to transformers' half-split one.
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
HEAD_DIM = DIM // HEADS
TOKENS = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(3))


def reference() -> nn.Module:
    from torchtune.models.llama3 import llama3

    model = llama3(vocab_size=VOCAB, num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV_HEADS, embed_dim=DIM,
                   max_seq_len=16, intermediate_dim=FFN, norm_eps=1e-5, rope_base=500000)
    return spread_scales(model)


def convert(model: nn.Module) -> StateDict:
    from torchtune.models.convert_weights import tune_to_hf

    return tune_to_hf(model.state_dict(), num_heads=HEADS, num_kv_heads=KV_HEADS, dim=DIM)


def port(state: StateDict, **config: object) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    settings: dict[str, object] = {
        "vocab_size": VOCAB, "hidden_size": DIM, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "max_position_embeddings": 16, "tie_word_embeddings": False, "use_cache": False,
        "attn_implementation": "eager", **config,
    }
    model = LlamaForCausalLM(LlamaConfig(**settings))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not [key for key in missing if "rotary" not in key], (missing, unexpected)
    return model


def unpermute(state: StateDict, key: str, heads: int) -> None:
    """Undo tune_to_hf's rotary permutation of one weight: the port that skips it."""
    weight = state[key]
    state[key] = weight.view(heads, 2, HEAD_DIM // 2, DIM).transpose(1, 2).reshape(heads * HEAD_DIM, DIM)


def set_act(model: nn.Module) -> None:
    from transformers.activations import ACT2FN

    for layer in model.model.layers:
        layer.mlp.act_fn = ACT2FN["gelu"]


BUGS = (
    Bug("rope-permutation-skipped", "layer 1's q_proj and k_proj copied without tune_to_hf's rotary permutation",
        "model.layers.1.self_attn",
        edit_state=lambda s: (unpermute(s, "model.layers.1.self_attn.q_proj.weight", HEADS),
                              unpermute(s, "model.layers.1.self_attn.k_proj.weight", KV_HEADS))),
    Bug("kv-swapped", "layer 0's k_proj and v_proj weights swapped", "model.layers.0.self_attn",
        edit_state=lambda s: swap(s, "model.layers.0.self_attn.k_proj.weight",
                                  "model.layers.0.self_attn.v_proj.weight")),
    Bug("gelu-for-silu", "hidden_act gelu instead of silu (every layer)", "model.layers.0.mlp.act_fn",
        edit_port=set_act),
    Bug("rms-eps", "rms_norm_eps 1e-2 instead of 1e-5 (every norm)", "model.layers.0.input_layernorm",
        edit_port=rms_eps(1e-2)),
    o_proj_transposed(1),
)

HAND_MAP = {
    "rename": TORCHTUNE_RENAMES,
    # tune_to_hf permutes the rows of q_proj and k_proj: their outputs are the same numbers in another order.
    "slots": [["self_attn\\.[qk]_proj$", "outputs", None]],
}

PORT = Port(
    name="torchtune",
    reference=reference,
    convert=convert,
    port=port,
    run_reference=lambda model: model(TOKENS),
    run_port=lambda model: model(input_ids=TOKENS),
    hand_map=HAND_MAP,
    bugs=BUGS,
    replay_bug="o-proj-transposed",
    ops_bug="gelu-for-silu",
    ops_in=("layers.0.mlp", "model.layers.0.mlp"),
)

WRONG: dict[tuple[str, str], str] = {}


run, test_verdict = verdict_tests(PORT, WRONG)
