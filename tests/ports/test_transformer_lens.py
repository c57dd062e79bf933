"""transformers' ``GPT2LMHeadModel`` (A) converted to transformer-lens's ``HookedTransformer`` (B).

The conversion is transformer-lens's own: its GPT-2 config conversion (``convert_hf_model_config`` on a
local config folder), its GPT-2 weight conversion (``pretrained.weight_conversions.gpt2.convert_gpt2_weights``:
GPT-2's fused ``c_attn`` Conv1D split into per-head ``W_Q``/``W_K``/``W_V``) and
``load_and_process_state_dict`` with every weight processing off (no LayerNorm folding, no centring),
as ``HookedTransformer.from_pretrained_no_processing`` loads GPT-2. transformer-lens 4 removed
``HookedTransformer``; the suite pins 3.9.0, the last release that has it. B's hook points are module
calls of their own (``blocks.0.attn.hook_q``).
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

VOCAB, LAYERS, DIM, HEADS, CTX = 64, 2, 32, 4, 16
TOKENS = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(7))


def gpt2_config() -> object:
    from transformers import GPT2Config

    return GPT2Config(vocab_size=VOCAB, n_positions=CTX, n_ctx=CTX, n_embd=DIM, n_layer=LAYERS, n_head=HEADS,
                      initializer_range=0.2, use_cache=False, attn_implementation="eager")


def reference() -> nn.Module:
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(gpt2_config())
    with torch.no_grad():   # GPT-2 starts with zero biases and unit LayerNorm scales: make them count
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.uniform_(-0.1, 0.1)
            elif ".ln_" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
    return model


def tl_config() -> object:
    config = gpt2_config()
    config.architectures = ["GPT2LMHeadModel"]
    return hooked_transformer_config(config)


def convert(model: nn.Module) -> StateDict:
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights

    return convert_gpt2_weights(model, tl_config())


def port(state: StateDict) -> nn.Module:
    return hooked_transformer(tl_config(), state)


BUGS = (
    Bug("qk-swapped", "layer 1's W_Q/W_K and b_Q/b_K swapped", "blocks.1.attn",
        edit_state=lambda s: [swap(s, f"blocks.1.attn.{a}", f"blocks.1.attn.{b}")
                              for a, b in (("W_Q", "W_K"), ("b_Q", "b_K"))]),
    Bug("gelu-for-gelu-new", "act_fn gelu instead of GPT-2's gelu_new (every layer)", "blocks.0.mlp",
        edit_port=hooked_exact_gelu),
    Bug("ln-eps", "LayerNorm eps 1e-6 instead of 1e-5 (every LayerNorm)", "blocks.0.ln1",
        edit_port=hooked_norm_eps(1e-6)),
    Bug("c-proj-transposed", "layer 0's attention c_proj (square) used without the Conv1D transpose",
        "blocks.0.attn", edit_state=hooked_w_o_transposed(0)),
    Bug("mlp-bias-missed", "layer 1's MLP output bias b_out not copied (left at zero)", "blocks.1.mlp",
        edit_state=lambda s: s["blocks.1.mlp.b_out"].zero_()),
)

HAND_MAP = {
    "rename": [
        ["^transformer\\.wte$", "embed"],
        ["^transformer\\.wpe$", "pos_embed"],
        ["^transformer\\.ln_f$", "ln_final"],
        ["^lm_head$", "unembed"],
        ["^transformer\\.h\\.(\\d+)\\.ln_1$", "blocks.\\1.ln1"],
        ["^transformer\\.h\\.(\\d+)\\.ln_2$", "blocks.\\1.ln2"],
        ["^transformer\\.h\\.(\\d+)(?=\\.|$)", "blocks.\\1"],
    ],
    # GPT-2's wpe takes position ids, transformer-lens's pos_embed the tokens (it makes the positions itself).
    "slots": [["^pos_embed$", "inputs.args.0", None]],
}

PORT = Port(
    name="transformer-lens",
    reference=reference,
    convert=convert,
    port=port,
    run_reference=lambda model: model(input_ids=TOKENS),
    run_port=lambda model: model(TOKENS),
    hand_map=HAND_MAP,
    bugs=BUGS,
    replay_bug="c-proj-transposed",
    ops_bug="gelu-for-gelu-new",
    ops_in=("transformer.h.0.mlp", "blocks.0.mlp"),
)

WRONG: dict[tuple[str, str], str] = {}


run, test_verdict = verdict_tests(PORT, WRONG)


def test_config_is_transformer_lens_own() -> None:
    """The port's config comes from transformer-lens's GPT-2 config conversion, not from this file."""
    config = tl_config()
    assert (config.act_fn, config.normalization_type, config.d_mlp, config.eps) == ("gelu_new", "LN", 4 * DIM, 1e-5)
