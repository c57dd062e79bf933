"""fair-esm's ESM-2 (A) converted to transformers' ``EsmForMaskedLM`` (B).

The conversion is the one of transformers' ``models/esm/convert_esm.py`` (huggingface/transformers, commit
010fab68), ESM-2 branch: the same ``EsmConfig`` (intermediate size 4 x embed, layer_norm_eps 1e-5,
rotary positions, no embedding LayerNorm) and the same module-by-module copy, inv_freq included. That
script loads a hub checkpoint and assigns attributes; transformers' wheel does not ship it, so its
copies are restated in ``KEYS`` as a key mapping. Rotary embeddings, other module names, and layers that
work in ``[T, B, E]`` (fair-esm) against ``[B, T, E]`` (transformers).
"""

from __future__ import annotations

import pytest

from tests.ports.harness import (
    INSTALL,
    Bug,
    Port,
    StateDict,
    swap,
    verdict_tests,
)

pytest.importorskip("esm", reason=f"the ports extra is not installed: {INSTALL}")

import torch  # noqa: E402
from torch import nn  # noqa: E402

LAYERS, DIM, HEADS = 2, 32, 4
TOKENS = torch.cat([torch.tensor([[0]]), torch.randint(4, 24, (1, 6), generator=torch.Generator().manual_seed(6)),
                    torch.tensor([[2]])], dim=1)   # <cls> six amino acids <eos>

# convert_esm.py's copies, fair-esm key -> transformers key ({i}: the layer).
KEYS = {
    "embed_tokens.weight": "esm.embeddings.word_embeddings.weight",
    "emb_layer_norm_after.{p}": "esm.encoder.emb_layer_norm_after.{p}",
    "layers.{i}.self_attn.q_proj.{p}": "esm.encoder.layer.{i}.attention.self.query.{p}",
    "layers.{i}.self_attn.k_proj.{p}": "esm.encoder.layer.{i}.attention.self.key.{p}",
    "layers.{i}.self_attn.v_proj.{p}": "esm.encoder.layer.{i}.attention.self.value.{p}",
    "layers.{i}.self_attn.rot_emb.inv_freq": "esm.encoder.layer.{i}.attention.self.rotary_embeddings.inv_freq",
    "layers.{i}.self_attn_layer_norm.{p}": "esm.encoder.layer.{i}.attention.LayerNorm.{p}",
    "layers.{i}.final_layer_norm.{p}": "esm.encoder.layer.{i}.LayerNorm.{p}",
    "layers.{i}.self_attn.out_proj.{p}": "esm.encoder.layer.{i}.attention.output.dense.{p}",
    "layers.{i}.fc1.{p}": "esm.encoder.layer.{i}.intermediate.dense.{p}",
    "layers.{i}.fc2.{p}": "esm.encoder.layer.{i}.output.dense.{p}",
    "lm_head.dense.{p}": "lm_head.dense.{p}",
    "lm_head.layer_norm.{p}": "lm_head.layer_norm.{p}",
    "lm_head.weight": "lm_head.decoder.weight",
    "lm_head.bias": "lm_head.bias",
}


def reference() -> nn.Module:
    import esm

    model = esm.model.esm2.ESM2(num_layers=LAYERS, embed_dim=DIM, attention_heads=HEADS,
                                alphabet=esm.data.Alphabet.from_architecture("ESM-1b"), token_dropout=True)
    with torch.no_grad():   # ESM-2 checkpoints hold inv_freq rounded to float16 (convert_esm.py's comment)
        for layer in model.layers:
            layer.self_attn.rot_emb.inv_freq.copy_(layer.self_attn.rot_emb.inv_freq.half().float())
    return model


def convert(model: nn.Module) -> StateDict:
    state = model.state_dict()
    converted = {}
    for source, target in KEYS.items():
        for i in range(LAYERS) if "{i}" in source else [None]:
            for p in ("weight", "bias") if "{p}" in source else [None]:
                converted[target.format(i=i, p=p)] = state[source.format(i=i, p=p)]
    return converted


def port(state: StateDict) -> nn.Module:
    import esm
    from transformers import EsmConfig, EsmForMaskedLM

    alphabet = esm.data.Alphabet.from_architecture("ESM-1b")
    config = EsmConfig(
        vocab_size=state["esm.embeddings.word_embeddings.weight"].shape[0], mask_token_id=alphabet.mask_idx,
        hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=4 * DIM,
        max_position_embeddings=1026, layer_norm_eps=1e-5, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0,
        pad_token_id=alphabet.padding_idx, emb_layer_norm_before=False, token_dropout=True,
        position_embedding_type="rotary", vocab_list=tuple(alphabet.all_toks), attn_implementation="eager",
    )
    model = EsmForMaskedLM(config)
    _, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    return model


def set_eps(model: nn.Module) -> None:
    for module in model.esm.encoder.modules():
        if isinstance(module, nn.LayerNorm):
            module.eps = 1e-12


def drop_inv_freq(state: StateDict) -> None:
    for i in range(LAYERS):
        del state[f"esm.encoder.layer.{i}.attention.self.rotary_embeddings.inv_freq"]


BUGS = (
    Bug("qk-swapped", "layer 1's query and key weights and biases swapped", "esm.encoder.layer.1.attention.self",
        edit_state=lambda s: [swap(s, f"esm.encoder.layer.1.attention.self.query.{p}",
                                   f"esm.encoder.layer.1.attention.self.key.{p}") for p in ("weight", "bias")]),
    Bug("inv-freq-not-copied", "rotary inv_freq recomputed in float32 instead of copied (every layer)",
        "esm.rotary_embeddings", edit_state=drop_inv_freq),
    Bug("bert-eps", "layer_norm_eps 1e-12 (BERT's default) instead of 1e-5 (every encoder LayerNorm)",
        "esm.encoder.layer.0.attention.LayerNorm", edit_port=set_eps),
    Bug("fc2-bias-missed", "layer 1's fc2 bias not copied (left at zero)", "esm.encoder.layer.1.output.dense",
        edit_state=lambda s: s["esm.encoder.layer.1.output.dense.bias"].zero_()),
    Bug("out-proj-transposed", "layer 0's attention out_proj weight (square) transposed",
        "esm.encoder.layer.0.attention.output.dense",
        edit_state=lambda s: s.__setitem__("esm.encoder.layer.0.attention.output.dense.weight",
                                           s["esm.encoder.layer.0.attention.output.dense.weight"].t().contiguous())),
)

HAND_MAP = {
    "rename": [
        ["^embed_tokens$", "esm.embeddings.word_embeddings"],
        ["^emb_layer_norm_after$", "esm.encoder.emb_layer_norm_after"],
        ["^layers\\.(\\d+)\\.self_attn\\.q_proj$", "esm.encoder.layer.\\1.attention.self.query"],
        ["^layers\\.(\\d+)\\.self_attn\\.k_proj$", "esm.encoder.layer.\\1.attention.self.key"],
        ["^layers\\.(\\d+)\\.self_attn\\.v_proj$", "esm.encoder.layer.\\1.attention.self.value"],
        ["^layers\\.(\\d+)\\.self_attn\\.rot_emb$", "esm.encoder.layer.\\1.attention.self.rotary_embeddings"],
        ["^layers\\.(\\d+)\\.self_attn\\.out_proj$", "esm.encoder.layer.\\1.attention.output.dense"],
        ["^layers\\.(\\d+)\\.self_attn_layer_norm$", "esm.encoder.layer.\\1.attention.LayerNorm"],
        ["^layers\\.(\\d+)\\.final_layer_norm$", "esm.encoder.layer.\\1.LayerNorm"],
        ["^layers\\.(\\d+)\\.fc1$", "esm.encoder.layer.\\1.intermediate.dense"],
        ["^layers\\.(\\d+)\\.fc2$", "esm.encoder.layer.\\1.output.dense"],
        ["^layers\\.(\\d+)$", "esm.encoder.layer.\\1"],
    ],
}

PORT = Port(
    name="esm",
    reference=reference,
    convert=convert,
    port=port,
    run_reference=lambda model: model(TOKENS),
    run_port=lambda model: model(input_ids=TOKENS),
    hand_map=HAND_MAP,
    bugs=BUGS,
    replay_bug="fc2-bias-missed",
    ops_bug="inv-freq-not-copied",
    ops_in=("layers.0.self_attn", "esm.encoder.layer.0.attention.self"),
)

# inv-freq-not-copied: transformers computes the rotary tables once (esm.rotary_embeddings), fair-esm inside each
# attention (rot_emb): neither call has a partner and the mistake first shows at layer 0's
# attention.output.dense input; the report names esm.rotary_embeddings as the likely source (docs/verdicts.md).
WRONG: dict[tuple[str, str], str] = {}


run, test_verdict = verdict_tests(PORT, WRONG)
