"""A tiny Q4_K GGUF file of a random Llama, for transformers' ``gguf_file=`` loading (dequantized to float).

gguf-py decodes Q4_K but does not encode it, so the encoder is here: each
block of 256 values is 8 sub-blocks of 32, each with a 6-bit scale and a
6-bit min under the block's float16 ``d`` and ``dmin``; a value is
``d * scale_j * q - dmin * min_j`` with ``q`` in 0..15 (llama.cpp's
``block_q4_K``: ``d``, ``dmin``, 12 bytes of packed scales and mins, 128
bytes of nibbles). Decoding is gguf-py's (``gguf.quants.dequantize``) and
transformers'. The decoder layers' matrices are Q4_K; embeddings, norms and
the output matrix stay float32, as llama.cpp's Q4_K_M keeps the sensitive ones
in higher precision.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import nn

HEADS, KV_HEADS = 4, 2
_NAMES = [("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
          ("self_attn.o_proj", "attn_output"), ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
          ("mlp.down_proj", "ffn_down"), ("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm")]


def q4_k(x: np.ndarray) -> np.ndarray:
    """``x`` (rows, a multiple of 256 columns) as Q4_K blocks: (rows, 144 bytes per 256 values)."""
    rows = x.shape[0]
    blocks = x.reshape(-1, 8, 32).astype(np.float32)
    lowest, highest = blocks.min(-1), blocks.max(-1)
    mins = np.maximum(0.0, -lowest)
    steps = (highest + mins) / 15
    d = (steps.max(-1) / 63).astype(np.float16)
    dmin = (mins.max(-1) / 63).astype(np.float16)
    d32 = np.where(d == 0, 1, d.astype(np.float32))[:, None]
    dmin32 = np.where(dmin == 0, 1, dmin.astype(np.float32))[:, None]
    scale = np.clip(np.round(steps / d32), 0, 63).astype(np.uint8)
    low = np.clip(np.round(mins / dmin32), 0, 63).astype(np.uint8)
    step = (d.astype(np.float32)[:, None] * scale)[..., None]
    offset = (dmin.astype(np.float32)[:, None] * low)[..., None]
    q = np.clip(np.round((blocks + offset) / np.where(step == 0, 1, step)), 0, 15).astype(np.uint8).reshape(-1, 256)
    packed = np.zeros((len(d), 12), np.uint8)
    for j in range(4):  # the inverse of llama.cpp's get_scale_min_k4
        packed[:, j] = (scale[:, j] & 63) | ((scale[:, j + 4] >> 4) << 6)
        packed[:, j + 4] = (low[:, j] & 63) | ((low[:, j + 4] >> 4) << 6)
        packed[:, j + 8] = (scale[:, j + 4] & 0xF) | ((low[:, j + 4] & 0xF) << 4)
    nibbles = np.zeros((len(d), 128), np.uint8)
    for c in range(4):
        nibbles[:, c * 32:(c + 1) * 32] = q[:, c * 64:c * 64 + 32] | (q[:, c * 64 + 32:c * 64 + 64] << 4)
    block = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), packed, nibbles], 1)
    return block.reshape(rows, -1)


def _permuted(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary layout of q/k rows (transformers undoes it when it loads the file)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_q4_k(model: nn.Module, path: Path) -> Path:
    """Write ``model`` (a ``LlamaForCausalLM`` with hidden and intermediate sizes multiples of 256) as GGUF."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"t{i}".encode() for i in range(config.vocab_size)])
    writer.add_token_scores([0.0] * config.vocab_size)
    writer.add_token_types([1] * config.vocab_size)
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    for i in range(config.num_hidden_layers):
        names.update({f"model.layers.{i}.{a}.weight": f"blk.{i}.{b}.weight" for a, b in _NAMES})
    for hf, name in names.items():
        tensor = state[hf]
        if name.endswith("attn_q.weight"):
            tensor = _permuted(tensor, config.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            tensor = _permuted(tensor, config.num_key_value_heads)
        if tensor.ndim == 2 and name.startswith("blk."):
            blocks = q4_k(tensor)
            writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        else:
            writer.add_tensor(name, tensor.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
