"""openai-whisper's ``Whisper`` (A) converted to transformers' ``WhisperForConditionalGeneration`` (B).

The conversion is the one of transformers' ``models/whisper/convert_openai_to_hf.py`` (huggingface/transformers,
commit 01080c62): drop the ``layers``/``blocks`` keys, rename every key by its ``WHISPER_MAPPING`` substring
rules, load into ``model.model`` with ``strict=False`` (only the position tables may be missing), and
tie ``proj_out`` to the decoder's token embedding. transformers' wheel does not ship that script, so its
rules are restated in ``RENAMES`` below, in its order; its hub downloads (checkpoint, generation config)
are left out, and the special token ids are set inside the tiny vocabulary. Conv front end, encoder,
decoder and cross-attention are all on the path.
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

pytest.importorskip("whisper", reason=f"the ports extra is not installed: {INSTALL}")

import torch  # noqa: E402
from torch import nn  # noqa: E402

VOCAB, MELS, AUDIO_CTX, TEXT_CTX, STATE, HEADS, LAYERS = 64, 8, 16, 16, 32, 4, 2
MEL = torch.randn(1, MELS, 2 * AUDIO_CTX, generator=torch.Generator().manual_seed(4))
TOKENS = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(5))

# WHISPER_MAPPING of convert_openai_to_hf.py: substring -> replacement, applied in this order.
RENAMES = (
    ("blocks", "layers"), ("mlp.0", "fc1"), ("mlp.2", "fc2"), ("mlp_ln", "final_layer_norm"),
    (".attn.query", ".self_attn.q_proj"), (".attn.key", ".self_attn.k_proj"), (".attn.value", ".self_attn.v_proj"),
    (".attn_ln", ".self_attn_layer_norm"), (".attn.out", ".self_attn.out_proj"),
    (".cross_attn.query", ".encoder_attn.q_proj"), (".cross_attn.key", ".encoder_attn.k_proj"),
    (".cross_attn.value", ".encoder_attn.v_proj"), (".cross_attn_ln", ".encoder_attn_layer_norm"),
    (".cross_attn.out", ".encoder_attn.out_proj"), ("decoder.ln.", "decoder.layer_norm."),
    ("encoder.ln.", "encoder.layer_norm."), ("token_embedding", "embed_tokens"),
    ("encoder.positional_embedding", "encoder.embed_positions.weight"),
    ("decoder.positional_embedding", "decoder.embed_positions.weight"), ("ln_post", "layer_norm"),
)


def reference() -> nn.Module:
    from whisper.model import ModelDimensions, Whisper

    dims = ModelDimensions(n_mels=MELS, n_audio_ctx=AUDIO_CTX, n_audio_state=STATE, n_audio_head=HEADS,
                           n_audio_layer=LAYERS, n_vocab=VOCAB, n_text_ctx=TEXT_CTX, n_text_state=STATE,
                           n_text_head=HEADS, n_text_layer=LAYERS)
    model = Whisper(dims)
    with torch.no_grad():   # whisper leaves the decoder's position table uninitialised (torch.empty)
        model.decoder.positional_embedding.normal_(0, 0.02)
    return model


def convert(model: nn.Module) -> StateDict:
    state = dict(model.state_dict())
    for key in ("layers", "blocks"):
        state.pop(key, None)
    converted = {}
    for key, value in state.items():
        new = key
        for old, replacement in RENAMES:
            if old in key:
                new = new.replace(old, replacement)
        converted[new] = value
    return converted


def port(state: StateDict) -> nn.Module:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    ffn_dim = state["decoder.layers.0.fc1.weight"].shape[0]
    config = WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=MELS, d_model=STATE, encoder_layers=LAYERS, decoder_layers=LAYERS,
        encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=ffn_dim,
        decoder_ffn_dim=ffn_dim, max_source_positions=AUDIO_CTX,
        max_target_positions=TEXT_CTX, eos_token_id=VOCAB - 1, bos_token_id=VOCAB - 1, pad_token_id=VOCAB - 1,
        decoder_start_token_id=VOCAB - 2, use_cache=False, attn_implementation="eager",
    )
    model = WhisperForConditionalGeneration(config)
    missing, _ = model.model.load_state_dict(state, strict=False)
    assert set(missing) <= {"encoder.embed_positions.weights", "decoder.embed_positions.weights"}, missing
    model.proj_out.weight = model.model.decoder.embed_tokens.weight
    return model


def bf16_reference(model: nn.Module) -> nn.Module:
    """whisper in bfloat16, as it runs in half precision: its LayerNorms compute in float32 (x.float())."""
    from whisper.model import LayerNorm

    model.to(torch.bfloat16)
    for module in model.modules():
        if isinstance(module, LayerNorm):
            module.float()
    return model


def set_act(model: nn.Module) -> None:
    from transformers.activations import ACT2FN

    for layer in (*model.model.encoder.layers, *model.model.decoder.layers):
        layer.activation_fn = ACT2FN["gelu_new"]


def scale_q_only(model: nn.Module) -> None:
    attention = model.model.decoder.layers[0].encoder_attn
    attention.scaling = (STATE // HEADS) ** -0.25   # whisper's dk**-0.25 put on q only, not on q and k


BUGS = (
    Bug("cross-kv-swapped", "decoder layer 1's cross-attention key and value weights swapped",
        "model.decoder.layers.1.encoder_attn",
        edit_state=lambda s: swap(s, "decoder.layers.1.encoder_attn.k_proj.weight",
                                  "decoder.layers.1.encoder_attn.v_proj.weight")),
    Bug("conv2-bias-missed", "the front end's conv2 bias not copied (left at zero)", "model.encoder.conv2",
        edit_state=lambda s: s["encoder.conv2.bias"].zero_()),
    Bug("gelu-tanh", "activation_function gelu_new (tanh) instead of gelu (every layer)",
        "model.encoder.layers.0.activation_fn", edit_port=set_act),
    Bug("cross-attn-scale", "decoder layer 0's cross-attention scaled by dk**-0.25 on q only",
        "model.decoder.layers.0.encoder_attn", edit_port=scale_q_only),
    Bug("out-proj-transposed", "decoder layer 0's self-attention out_proj weight (square) transposed",
        "model.decoder.layers.0.self_attn.out_proj",
        edit_state=lambda s: s.__setitem__("decoder.layers.0.self_attn.out_proj.weight",
                                           s["decoder.layers.0.self_attn.out_proj.weight"].t().contiguous())),
)

HAND_MAP = {
    "rename": [
        ["^(encoder|decoder)\\.blocks(?=\\.|$)", "\\1.layers"],
        ["^(encoder|decoder)(?=\\.|$)", "model.\\1"],
        ["^model\\.encoder\\.ln_post$", "model.encoder.layer_norm"],
        ["^model\\.decoder\\.ln$", "model.decoder.layer_norm"],
        ["^model\\.decoder\\.token_embedding$", "model.decoder.embed_tokens"],
        ["\\.cross_attn_ln$", ".encoder_attn_layer_norm"],
        ["\\.attn_ln$", ".self_attn_layer_norm"],
        ["\\.mlp_ln$", ".final_layer_norm"],
        ["\\.cross_attn(?=\\.|$)", ".encoder_attn"],
        ["\\.attn(?=\\.|$)", ".self_attn"],
        ["\\.query$", ".q_proj"],
        ["\\.key$", ".k_proj"],
        ["\\.value$", ".v_proj"],
        ["\\.out$", ".out_proj"],
        ["\\.mlp\\.0$", ".fc1"],
        ["\\.mlp\\.1$", ".activation_fn"],
        ["\\.mlp\\.2$", ".fc2"],
    ],
    # whisper's blocks take (x, xa, mask=): the audio features second, a [n_ctx, n_ctx] mask by keyword;
    # transformers' layers take (hidden_states, attention_mask [B, 1, T, T], encoder_hidden_states=).
    "slots": [
        ["^model\\.decoder\\.layers\\.\\d+$", "inputs.args.1", "inputs.kwargs.encoder_hidden_states"],
        ["^model\\.decoder\\.layers\\.\\d+(\\.self_attn)?$", "inputs.kwargs.mask", None],
    ],
}

PORT = Port(
    name="whisper",
    reference=reference,
    convert=convert,
    port=port,
    run_reference=lambda model: model(MEL.to(model.encoder.conv1.weight.dtype), TOKENS),
    run_port=lambda model: model(input_features=MEL.to(model.dtype), decoder_input_ids=TOKENS),
    hand_map=HAND_MAP,
    bugs=BUGS,
    replay_bug="conv2-bias-missed",
    ops_bug="cross-attn-scale",
    ops_in=("decoder.blocks.0.cross_attn", "model.decoder.layers.0.encoder_attn"),
    bf16_reference=bf16_reference,
)

WRONG: dict[tuple[str, str], str] = {}


run, test_verdict = verdict_tests(PORT, WRONG)
