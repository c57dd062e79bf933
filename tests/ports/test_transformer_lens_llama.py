"""transformers' ``LlamaForCausalLM`` (A) converted to transformer-lens's ``HookedTransformer`` (B).

transformer-lens's own Llama conversion: ``convert_hf_model_config`` on a local config folder (RMSNorm,
gated SiLU MLP, rotary on half-split pairs, grouped-query attention) and
``pretrained.weight_conversions.llama.convert_llama_weights`` (per-head ``W_Q``, ``_W_K``, ``_W_V``),
loaded with every weight processing off. A second rotary port beside torchtune's, through another
project's conversion, with B's hook points as module calls.
"""

from __future__ import annotations

import pytest

from tests.ports.harness import (
    INSTALL,
    Bug,
    Port,
    StateDict,
    hooked_exact_gelu,
    hooked_norm_eps,
    hooked_transformer,
    hooked_transformer_config,
    hooked_w_o_transposed,
    swap,
    verdict_tests,
)

pytest.importorskip("transformer_lens", reason=f"the ports extra is not installed: {INSTALL}")

import torch  # noqa: E402
from torch import nn  # noqa: E402

VOCAB, LAYERS, DIM, HEADS, KV_HEADS, FFN, CTX = 64, 2, 32, 4, 2, 64, 16
TOKENS = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(8))


def llama_config() -> object:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
                       num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=CTX,
                       initializer_range=0.2, use_cache=False, attn_implementation="eager",
                       architectures=["LlamaForCausalLM"])


def reference() -> nn.Module:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(llama_config())
    with torch.no_grad():   # RMSNorm scales start at one: make them count
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model


def tl_config() -> object:
    return hooked_transformer_config(llama_config())


def convert(model: nn.Module) -> StateDict:
    from transformer_lens.pretrained.weight_conversions.llama import convert_llama_weights

    return convert_llama_weights(model, tl_config())


def port(state: StateDict) -> nn.Module:
    return hooked_transformer(tl_config(), state)


def adjacent_pairs(model: nn.Module) -> None:
    model.cfg.rotary_adjacent_pairs = True   # GPT-J's interleaved pairs instead of Llama's halves


BUGS = (
    Bug("kv-swapped", "layer 0's _W_K and _W_V swapped (GQA: same shape)", "blocks.0.attn",
        edit_state=lambda s: swap(s, "blocks.0.attn._W_K", "blocks.0.attn._W_V")),
    Bug("rotary-adjacent-pairs", "rotary_adjacent_pairs on: interleaved pairs instead of halves", "blocks.0.attn",
        edit_port=adjacent_pairs),
    Bug("gelu-for-silu", "act_fn gelu instead of silu (every layer)", "blocks.0.mlp",
        edit_port=hooked_exact_gelu),
    Bug("rms-eps", "RMSNorm eps 1e-5 instead of the config's 1e-6 (every norm)", "blocks.0.ln1",
        edit_port=hooked_norm_eps(1e-5)),
    Bug("o-transposed", "layer 1's o_proj (square) transposed into W_O", "blocks.1.attn",
        edit_state=hooked_w_o_transposed(1)),
)

HAND_MAP = {
    "rename": [
        ["^model\\.embed_tokens$", "embed"],
        ["^model\\.norm$", "ln_final"],
        ["^lm_head$", "unembed"],
        ["^model\\.layers\\.(\\d+)\\.input_layernorm$", "blocks.\\1.ln1"],
        ["^model\\.layers\\.(\\d+)\\.post_attention_layernorm$", "blocks.\\1.ln2"],
        ["^model\\.layers\\.(\\d+)\\.self_attn$", "blocks.\\1.attn"],
        ["^model\\.layers\\.(\\d+)\\.mlp$", "blocks.\\1.mlp"],
        ["^model\\.layers\\.(\\d+)$", "blocks.\\1"],
    ],
}

PORT = Port(
    name="transformer-lens-llama",
    reference=reference,
    convert=convert,
    port=port,
    run_reference=lambda model: model(input_ids=TOKENS),
    run_port=lambda model: model(TOKENS),
    hand_map=HAND_MAP,
    bugs=BUGS,
    replay_bug="o-transposed",
    ops_bug="rotary-adjacent-pairs",
    ops_in=("model.layers.0.self_attn", "blocks.0.attn"),
)

WRONG: dict[tuple[str, str], str] = {}


run, test_verdict = verdict_tests(PORT, WRONG)
