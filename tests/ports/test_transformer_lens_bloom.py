"""transformers' ``BloomForCausalLM`` (A) converted to transformer-lens's ``HookedTransformer`` (B).

transformer-lens's own BLOOM conversion: ``convert_hf_model_config`` on a local config folder and
``pretrained.weight_conversions.bloom.convert_bloom_weights`` (the fused, per-head interleaved
``query_key_value`` split into ``W_Q``/``W_K``/``W_V``; ALiBi instead of position embeddings), loaded with
every weight processing off. The two sides cut the block differently: transformers' ``self_attention`` and
``mlp`` add the residual inside, transformer-lens's ``attn`` and ``mlp`` do not; transformer-lens calls
``ln1`` once for each of q, k and v.
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

VOCAB, LAYERS, DIM, HEADS = 64, 2, 32, 4
TOKENS = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(9))


def bloom_config() -> object:
    from transformers import BloomConfig

    return BloomConfig(vocab_size=VOCAB, hidden_size=DIM, n_layer=LAYERS, n_head=HEADS, initializer_range=0.2,
                       use_cache=False, attn_implementation="eager", architectures=["BloomForCausalLM"])


def reference() -> nn.Module:
    from transformers import BloomForCausalLM

    model = BloomForCausalLM(bloom_config())
    return spread_layernorms(model)


def tl_config() -> object:
    return hooked_transformer_config(bloom_config())


def convert(model: nn.Module) -> StateDict:
    from transformer_lens.pretrained.weight_conversions.bloom import convert_bloom_weights

    return convert_bloom_weights(model, tl_config())


def port(state: StateDict) -> nn.Module:
    return hooked_transformer(tl_config(), state)


def embed_ln_skipped(state: StateDict) -> None:
    """``word_embeddings_layernorm`` left at its initial one and zero."""
    state["embed.ln.w"] = torch.ones_like(state["embed.ln.w"])
    state["embed.ln.b"] = torch.zeros_like(state["embed.ln.b"])


COMMON = hooked_common_bugs(1e-5)
BUGS = (
    COMMON[0],
    Bug("embed-ln-skipped", "word_embeddings_layernorm not copied (one and zero)", "embed.ln",
        edit_state=embed_ln_skipped),
    *COMMON[1:],
)

# transformer-lens's embed returns the embeddings after its LayerNorm (embed.ln): transformers' word_embeddings
# has no partner. transformers' self_attention and mlp return the residual added: their output projections pair
# with transformer-lens's attn and mlp, whose inputs (the attention's and the MLP's) are not the projections'.
HAND_MAP = {
    "rename": [
        ["^transformer\\.word_embeddings_layernorm$", "embed.ln"],
        ["^transformer\\.ln_f$", "ln_final"],
        ["^lm_head$", "unembed"],
        ["^transformer\\.h\\.(\\d+)\\.input_layernorm$", "blocks.\\1.ln1"],
        ["^transformer\\.h\\.(\\d+)\\.post_attention_layernorm$", "blocks.\\1.ln2"],
        ["^transformer\\.h\\.(\\d+)\\.self_attention\\.dense$", "blocks.\\1.attn"],
        ["^transformer\\.h\\.(\\d+)\\.mlp\\.dense_4h_to_h$", "blocks.\\1.mlp"],
        ["^transformer\\.h\\.(\\d+)$", "blocks.\\1"],
    ],
    "slots": [["self_attention\\.dense$|mlp\\.dense_4h_to_h$", "inputs.args.0", None]],
}

PORT = Port(
    name="transformer-lens-bloom",
    reference=reference,
    convert=convert,
    port=port,
    run_reference=lambda model: model(input_ids=TOKENS),
    run_port=lambda model: model(TOKENS),
    hand_map=HAND_MAP,
    bugs=BUGS,
    replay_bug="o-transposed",
    ops_bug="ln-eps",
    ops_in=("transformer.h.0.input_layernorm", "blocks.0.ln1"),
)

WRONG: dict[tuple[str, str], str] = {}


run, test_verdict = verdict_tests(PORT, WRONG)
