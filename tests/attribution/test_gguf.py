"""A Q4_K GGUF file dequantized by transformers (``gguf_file=``) is ranked like any quantized model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tracediff.attribution import attribute

from .conftest import captured
from .gguf_q4k import q4_k, write_q4_k


def test_q4_k_blocks_decode_with_gguf_py_within_a_step() -> None:
    gguf = pytest.importorskip("gguf", reason="gguf is in the ports extra")
    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    back = gguf.quants.dequantize(q4_k(x), gguf.GGMLQuantizationType.Q4_K)
    # 16 levels over each sub-block's range (max - min over 32 values): rounding to the nearest level is off by
    # at most half a step, and the 6-bit scale and float16 d move the step by under 1/63 of the block's largest,
    # so one full step of the widest sub-block bounds the error on any machine.
    widest = float((x.reshape(-1, 32).max(-1) - np.minimum(0, x.reshape(-1, 32).min(-1))).max()) / 15
    assert np.abs(back - x).max() <= widest


def test_a_gguf_q4_k_model_is_ranked(tmp_path: Path) -> None:
    pytest.importorskip("gguf", reason="gguf is in the ports extra")
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
                         attn_implementation="eager", tie_word_embeddings=False)
    torch.manual_seed(0)
    float_model = LlamaForCausalLM(config).eval()
    write_q4_k(float_model, tmp_path / "tiny-q4_k.gguf")
    b = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny-q4_k.gguf", dtype=torch.float32,
                                             attn_implementation="eager", use_cache=False).eval()
    kwargs = {"input_ids": torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1))}
    result = attribute(b, captured(tmp_path, float_model, kwargs), modules="leaves")

    by_path = {c.module_path.split(".", 1)[1]: c for c in result.ranking}
    assert result.final_error.value > 0 and len(result.ranking) == len(by_path)
    # the Q4_K matrices carry a local error; the float32 embeddings and output matrix none at all
    assert all(by_path[f"model.layers.{i}.mlp.down_proj"].local_error > 0 for i in range(3))
    assert by_path["lm_head"].local_error == 0 and by_path["lm_head"].share == 0
    assert by_path["model.embed_tokens"].local_error == 0
    assert result.top is not None and result.top.module_path.startswith("LlamaForCausalLM.model.layers.")
