"""torchtune's Gemma 2 builder (A) converted to transformers' ``Gemma2ForCausalLM`` (B): a mistake found in the
wild.

torchtune 0.6.1's ``models/gemma2/_convert_weights.py`` maps transformers' ``post_feedforward_layernorm`` to
torchtune's ``mlp_norm``, which its ``TransformerSelfAttentionLayer`` applies *before* the MLP, and
``pre_feedforward_layernorm`` to ``mlp_scale``, applied *after* it: the two norms of every layer are
crossed. The suite's clean port is torchtune's ``gemma2_tune_to_hf`` with the two norms put back; the case
``converter-as-shipped`` is the converter as it ships, and ``align`` names the norm.

One more difference, of the models rather than of the conversion: torchtune's ``Gemma2FinalNorm``
soft-caps the normed hidden state with ``final_capping_value``, transformers soft-caps the logits with
``final_logit_softcapping``. Both caps are turned off here (a cap of 1e9 on torchtune's side is the
identity in float32) so that the conversion is what is measured.
"""

from __future__ import annotations

import pytest

from tests.ports.harness import (
    INSTALL,
    Bug,
    Port,
    StateDict,
    o_proj_transposed,
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
NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")


def reference() -> nn.Module:
    from torchtune.models.gemma2._component_builders import gemma2

    model = gemma2(vocab_size=VOCAB, num_layers=LAYERS, num_heads=HEADS, head_dim=HEAD_DIM, num_kv_heads=KV_HEADS,
                   embed_dim=DIM, intermediate_dim=FFN, max_seq_len=16, norm_eps=1e-6, hidden_capping_value=50.0,
                   final_capping_value=1e9, sliding_window_size=4096, query_pre_attn_scalar=HEAD_DIM)
    return spread_scales(model)


def shipped(model: nn.Module) -> StateDict:
    """torchtune's converter as it ships."""
    from torchtune.models.gemma2._convert_weights import gemma2_tune_to_hf

    return gemma2_tune_to_hf(model.state_dict(), num_heads=HEADS, num_kv_heads=KV_HEADS, dim=DIM, head_dim=HEAD_DIM)


def cross_norms(state: StateDict) -> None:
    """Swap every layer's pre- and post-feed-forward norm weights: undoes (or makes) the shipped mistake."""
    for layer in range(LAYERS):
        swap(state, *(f"model.layers.{layer}.{norm}.weight" for norm in NORMS))


def convert(model: nn.Module) -> StateDict:
    """The corrected conversion: torchtune's converter, each layer's two feed-forward norms put back."""
    state = shipped(model)
    cross_norms(state)
    return state


def port(state: StateDict) -> nn.Module:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, rms_norm_eps=1e-6,
        max_position_embeddings=16, query_pre_attn_scalar=HEAD_DIM, attn_logit_softcapping=50.0,
        final_logit_softcapping=None, sliding_window=4096, hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True, use_cache=False, attn_implementation="eager", pad_token_id=0)
    model = Gemma2ForCausalLM(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # the output projection is tied to the token embedding on both sides (torchtune's TiedLinear)
    assert not unexpected and not [key for key in missing if "rotary" not in key and key != "lm_head.weight"], \
        (missing, unexpected)
    model.tie_weights()
    return model


def norm_eps(model: nn.Module) -> None:
    for layer in model.model.layers:
        for name in ("input_layernorm", "post_attention_layernorm", *NORMS):
            getattr(layer, name).eps = 1e-2


BUGS = (
    Bug("converter-as-shipped", "torchtune 0.6.1's gemma2_tune_to_hf: pre- and post-feed-forward norms crossed",
        "model.layers.0.pre_feedforward_layernorm", edit_state=cross_norms),
    Bug("kv-swapped", "layer 0's k_proj and v_proj weights swapped", "model.layers.0.self_attn",
        edit_state=lambda s: swap(s, "model.layers.0.self_attn.k_proj.weight",
                                  "model.layers.0.self_attn.v_proj.weight")),
    Bug("rms-eps", "rms_norm_eps 1e-2 instead of 1e-6 (every layer norm)", "model.layers.0.input_layernorm",
        edit_port=norm_eps),
    o_proj_transposed(1),
)

HAND_MAP = {
    "rename": [
        ["^tok_embeddings$", "model.embed_tokens"],
        ["^norm$", "model.norm"],
        ["^layers(?=\\.|$)", "model.layers"],
        ["^(model\\.layers\\.\\d+\\.)attn(?=\\.|$)", "\\1self_attn"],
        ["\\.output_proj$", ".o_proj"],
        ["\\.sa_norm$", ".input_layernorm"],
        ["\\.sa_scale$", ".post_attention_layernorm"],
        ["\\.mlp_norm$", ".pre_feedforward_layernorm"],
        ["\\.mlp_scale$", ".post_feedforward_layernorm"],
        ["\\.mlp\\.w1$", ".mlp.gate_proj"],
        ["\\.mlp\\.w3$", ".mlp.up_proj"],
        ["\\.mlp\\.w2$", ".mlp.down_proj"],
        ["\\.mlp\\.activation$", ".mlp.act_fn"],
    ],
    # gemma2_tune_to_hf permutes the rows of q_proj and k_proj: their outputs are the same numbers in another order
    "slots": [["self_attn\\.[qk]_proj$", "outputs", None]],
}

PORT = Port(
    name="torchtune_gemma2",
    reference=reference,
    convert=convert,
    port=port,
    run_reference=lambda model: model(TOKENS),
    run_port=lambda model: model(input_ids=TOKENS),
    hand_map=HAND_MAP,
    bugs=BUGS,
    replay_bug="converter-as-shipped",
    ops_bug="rms-eps",
    ops_in=("layers.0.sa_norm", "model.layers.0.input_layernorm"),
)

WRONG: dict[tuple[str, str], str] = {}


run, test_verdict = verdict_tests(PORT, WRONG)
