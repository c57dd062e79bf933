"""A lit-gpt-style Llama (A: one fused ``qkv`` projection, grouped-query attention, rotary tables made in the
model's own code and passed to every block, a boolean keep-mask; ``tests/ports/research.py``) converted to
transformers' ``LlamaForCausalLM`` (B) as lit-gpt's ``convert_lit_checkpoint`` does: ``qkv`` split in three,
keys renamed. The port where replay meets attention with a fused q/k/v and a mask in another convention.
"""

from __future__ import annotations

import torch
from torch import nn

from tests.ports.harness import Bug, Port, StateDict, o_proj_transposed, rms_eps, swap, verdict_tests
from tests.ports.research import FusedLlama, fused_llama_to_hf

VOCAB, LAYERS, HEADS, GROUPS, DIM, FFN, SEQ = 64, 2, 4, 2, 32, 64, 8
TOKENS = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(3))


def reference() -> nn.Module:
    model = FusedLlama(vocab=VOCAB, layers=LAYERS, dim=DIM, heads=HEADS, groups=GROUPS, hidden=FFN)
    with torch.no_grad():  # RMSNorm scales start at one: make them count
        for name, param in model.named_parameters():
            if "norm" in name or "ln_f" in name:
                param.uniform_(0.5, 1.5)
    return model


def convert(model: nn.Module) -> StateDict:
    return fused_llama_to_hf(model.state_dict(), heads=HEADS, groups=GROUPS, dim=DIM)


def port(state: StateDict) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=GROUPS, rms_norm_eps=1e-5,
                         rope_theta=10000.0, max_position_embeddings=16, tie_word_embeddings=False,
                         use_cache=False, attn_implementation="eager")
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not [key for key in missing if "rotary" not in key], (missing, unexpected)
    return model


BUGS = (
    Bug("kv-swapped", "layer 1's k and v rows of qkv split into v_proj and k_proj", "model.layers.1.self_attn",
        edit_state=lambda s: swap(s, "model.layers.1.self_attn.k_proj.weight",
                                  "model.layers.1.self_attn.v_proj.weight")),
    Bug("rms-eps", "rms_norm_eps 1e-2 instead of 1e-5 (every layer norm)", "model.layers.0.input_layernorm",
        edit_port=rms_eps(1e-2)),
    o_proj_transposed(0),
)

HAND_MAP = {
    "rename": [
        ["^transformer\\.wte$", "model.embed_tokens"],
        ["^transformer\\.ln_f$", "model.norm"],
        ["^transformer\\.h(?=\\.|$)", "model.layers"],
        ["^(model\\.layers\\.\\d+\\.)attn(?=\\.|$)", "\\1self_attn"],
        ["\\.norm_1$", ".input_layernorm"],
        ["\\.norm_2$", ".post_attention_layernorm"],
        ["(\\.self_attn)\\.proj$", "\\1.o_proj"],
        ["\\.mlp\\.fc_1$", ".mlp.gate_proj"],
        ["\\.mlp\\.fc_2$", ".mlp.up_proj"],
        ["\\.mlp\\.proj$", ".mlp.down_proj"],
    ],
}

PORT = Port(
    name="research_llama",
    reference=reference,
    convert=convert,
    port=port,
    run_reference=lambda model: model(TOKENS),
    run_port=lambda model: model(input_ids=TOKENS),
    hand_map=HAND_MAP,
    bugs=BUGS,
    replay_bug="kv-swapped",
    ops_bug="rms-eps",
    ops_in=("transformer.h.0.norm_1", "model.layers.0.input_layernorm"),
)

WRONG: dict[tuple[str, str], str] = {}


run, test_verdict = verdict_tests(PORT, WRONG)
