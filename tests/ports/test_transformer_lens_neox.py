"""transformers' ``GPTNeoXForCausalLM`` (A, Pythia's architecture) converted to transformer-lens's
``HookedTransformer`` (B).

transformer-lens's own GPT-NeoX conversion: ``convert_hf_model_config`` on a local config folder (parallel
attention and MLP, rotary on half of each head) and ``pretrained.weight_conversions.neox.convert_neox_weights``
(the fused, per-head interleaved ``query_key_value`` split into ``W_Q``/``W_K``/``W_V``), loaded with every
weight processing off. transformers names the attention ``attention``, transformer-lens ``attn``.
"""

from __future__ import annotations

import pytest

from tests.ports.harness import (
    INSTALL,
    Bug,
    Port,
    StateDict,
    hooked_common_bugs,
    hooked_transformer,
    hooked_transformer_config,
    spread_layernorms,
    verdict_tests,
)

pytest.importorskip("transformer_lens", reason=f"the ports extra is not installed: {INSTALL}")

import torch  # noqa: E402
from torch import nn  # noqa: E402

VOCAB, LAYERS, DIM, HEADS, FFN, CTX = 64, 2, 32, 4, 64, 16
TOKENS = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(10))


def neox_config() -> object:
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(vocab_size=VOCAB, hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         intermediate_size=FFN, max_position_embeddings=CTX, rotary_pct=0.5,
                         use_parallel_residual=True, initializer_range=0.2, use_cache=False,
                         attn_implementation="eager", architectures=["GPTNeoXForCausalLM"])


def reference() -> nn.Module:
    from transformers import GPTNeoXForCausalLM

    model = GPTNeoXForCausalLM(neox_config())
    return spread_layernorms(model)


def tl_config() -> object:
    return hooked_transformer_config(neox_config())


def convert(model: nn.Module) -> StateDict:
    from transformer_lens.pretrained.weight_conversions.neox import convert_neox_weights

    return convert_neox_weights(model, tl_config())


def port(state: StateDict) -> nn.Module:
    return hooked_transformer(tl_config(), state)


def adjacent_pairs(model: nn.Module) -> None:
    model.cfg.rotary_adjacent_pairs = True   # GPT-J's interleaved pairs instead of GPT-NeoX's halves


COMMON = hooked_common_bugs(1e-5)
BUGS = (
    COMMON[0],
    Bug("rotary-adjacent-pairs", "rotary_adjacent_pairs on: interleaved pairs instead of halves", "blocks.0.attn",
        edit_port=adjacent_pairs),
    *COMMON[1:],
)

HAND_MAP = {
    "rename": [
        ["^gpt_neox\\.embed_in$", "embed"],
        ["^gpt_neox\\.final_layer_norm$", "ln_final"],
        ["^embed_out$", "unembed"],
        ["^gpt_neox\\.layers\\.(\\d+)\\.input_layernorm$", "blocks.\\1.ln1"],
        ["^gpt_neox\\.layers\\.(\\d+)\\.post_attention_layernorm$", "blocks.\\1.ln2"],
        ["^gpt_neox\\.layers\\.(\\d+)\\.attention$", "blocks.\\1.attn"],
        ["^gpt_neox\\.layers\\.(\\d+)\\.mlp$", "blocks.\\1.mlp"],
        ["^gpt_neox\\.layers\\.(\\d+)$", "blocks.\\1"],
    ],
}

PORT = Port(
    name="transformer-lens-neox",
    reference=reference,
    convert=convert,
    port=port,
    run_reference=lambda model: model(input_ids=TOKENS),
    run_port=lambda model: model(TOKENS),
    hand_map=HAND_MAP,
    bugs=BUGS,
    replay_bug="o-transposed",
    ops_bug="ln-eps",
    ops_in=("gpt_neox.layers.0.input_layernorm", "blocks.0.ln1"),
)

WRONG: dict[tuple[str, str], str] = {}


run, test_verdict = verdict_tests(PORT, WRONG)
