"""SPECs for docs/attribution.md: a small Llama in float32, and the same model with torchao int4 weights.

    tracediff capture docs/examples/attribution_int4.py:float_model --out traces/float
    tracediff attribute traces/float docs/examples/attribution_int4.py:int4_model --budget 2

Random weights (seed 0) with one outlier channel in layer 4's RMSNorm gains, as trained LLMs have; every
decoder layer's Linears quantized to int4 (groups of 32, torchao's CPU packing), the embeddings and lm_head
kept in float32, as quantization recipes do.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def float_model() -> tuple[nn.Module, dict[str, Any]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    # transformers' defaults: sdpa attention, the cache on (each layer takes a DynamicCache)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.layers[4].input_layernorm.weight[7] = 40.0
        model.model.layers[4].post_attention_layernorm.weight[7] = 40.0
    ids = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids}


def int4_model() -> tuple[nn.Module, dict[str, Any]]:
    from torchao.quantization import Int4WeightOnlyConfig, quantize_

    model, inputs = float_model()
    quantize_(model, Int4WeightOnlyConfig(group_size=32, int4_packing_format="opaque"),
              filter_fn=lambda module, fqn: isinstance(module, nn.Linear) and fqn.startswith("model.layers."))
    return model, inputs
