"""transformers' ``LlamaForCausalLM`` (A) converted to transformer-lens's ``HookedTransformer`` (B).

transformer-lens's own Llama conversion: ``convert_hf_model_config`` on a local config folder (RMSNorm,
gated SiLU MLP, rotary on half-split pairs, grouped-query attention) and
``pretrained.weight_conversions.llama.convert_llama_weights`` (per-head ``W_Q``, ``_W_K``, ``_W_V``),
loaded with every weight processing off. A second rotary port beside torchtune's, through another
project's conversion, with B's hook points as module calls.
"""

from __future__ import annotations

import tempfile

import pytest

from tests.ports.harness import (
    INSTALL,
    UNMAPPED,
    Bug,
    Port,
    PortRun,
    StateDict,
    parametrized,
    swap,
    wrong_in,
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
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.loading_from_pretrained import convert_hf_model_config

    with tempfile.TemporaryDirectory() as folder:
        llama_config().save_pretrained(folder)
        settings = convert_hf_model_config(folder)
    settings["tokenizer_name"] = None   # the tiny model has no tokenizer: tokens go in directly
    return HookedTransformerConfig(**settings)


def convert(model: nn.Module) -> StateDict:
    from transformer_lens.pretrained.weight_conversions.llama import convert_llama_weights

    return convert_llama_weights(model, tl_config())


def port(state: StateDict) -> nn.Module:
    from transformer_lens import HookedTransformer

    model = HookedTransformer(tl_config())
    model.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                      fold_value_biases=False, refactor_factored_attn_matrices=False)
    return model


def adjacent_pairs(model: nn.Module) -> None:
    model.cfg.rotary_adjacent_pairs = True   # GPT-J's interleaved pairs instead of Llama's halves


def set_act(model: nn.Module) -> None:
    for block in model.blocks:
        block.mlp.act_fn = torch.nn.functional.gelu


def set_eps(model: nn.Module) -> None:
    for name, module in model.named_modules():
        if name.endswith(("ln1", "ln2", "ln_final")):
            module.eps = 1e-5


def o_transposed(state: StateDict) -> None:
    w_o = state["blocks.1.attn.W_O"]
    heads, head_dim, dim = w_o.shape
    state["blocks.1.attn.W_O"] = w_o.reshape(heads * head_dim, dim).t().reshape(heads, head_dim, dim).contiguous()


BUGS = (
    Bug("kv-swapped", "layer 0's _W_K and _W_V swapped (GQA: same shape)", "blocks.0.attn",
        edit_state=lambda s: swap(s, "blocks.0.attn._W_K", "blocks.0.attn._W_V")),
    Bug("rotary-adjacent-pairs", "rotary_adjacent_pairs on: interleaved pairs instead of halves", "blocks.0.attn",
        edit_port=adjacent_pairs),
    Bug("gelu-for-silu", "act_fn gelu instead of silu (every layer)", "blocks.0.mlp", edit_port=set_act),
    Bug("rms-eps", "RMSNorm eps 1e-5 instead of the config's 1e-6 (every norm)", "blocks.0.ln1", edit_port=set_eps),
    Bug("o-transposed", "layer 1's o_proj (square) transposed into W_O", "blocks.1.attn", edit_state=o_transposed),
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

EVERY = ("clean", *(bug.name for bug in BUGS), "bf16")
HOOKS = ("structure pairs transformers' embed_tokens and its other calls with transformer-lens's hook points: "
         "even the clean port diverges at hook_embed")
ACT_IS_HOOK = ("with --match auto, structure pairs transformers' mlp.act_fn with transformer-lens's "
               "mlp.hook_pre (same input, but a hook point is the identity): even the clean port diverges "
               "at blocks.0.mlp.hook_pre")
WRONG: dict[tuple[str, str], str] = {
    **wrong_in(EVERY, UNMAPPED, HOOKS),
    **wrong_in(EVERY, ("hand map",), ACT_IS_HOOK),
    ("rotary-adjacent-pairs", "ops"): ACT_IS_HOOK,
    ("o-transposed", "replay"): "replay skips every call (transformer-lens's blocks do not take transformers' "
                                "recorded arguments) and finds no culprit",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> PortRun:
    return PortRun(PORT, tmp_path_factory.mktemp("transformer_lens_llama"))


@pytest.mark.parametrize(("case", "mode"), parametrized(PORT, WRONG))
def test_verdict(run: PortRun, case: str, mode: str) -> None:
    outcome = run.judge(case, mode)
    assert outcome.right, outcome
