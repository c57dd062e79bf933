"""Stock transformers families at their defaults, tiny and seeded, for the tests of traces captured as users
capture them: ``model(input_ids=ids)`` with nothing else passed (transformers' cache on, its default attention).

Hidden size 64 (int4 groups of 32 fit), 3 layers (Gemma 3: its sliding/global pattern over 6), 2 KV heads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from . import models

VOCAB = 256
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, max_position_embeddings=64)


def token_ids(seed: int = 1, length: int = 16) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def _built(config_cls: str, model_cls: str, seed: int, **options: object) -> nn.Module:
    import transformers

    config = getattr(transformers, config_cls)(**{**_COMMON, **options})
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(config).eval()


def llama(*, layers: int = 3, seed: int = 0) -> nn.Module:
    """A ``LlamaForCausalLM`` whose layers weigh differently (as :func:`.models.llama`), at defaults otherwise."""
    model = _built("LlamaConfig", "LlamaForCausalLM", seed, num_hidden_layers=layers)
    with torch.no_grad():
        for layer, scale in zip(model.model.layers, models._layer_scales(layers, seed + 1)):
            layer.self_attn.o_proj.weight.mul_(float(scale))
            layer.mlp.down_proj.weight.mul_(float(scale))
    return model


def qwen3(*, seed: int = 0) -> nn.Module:
    return _built("Qwen3Config", "Qwen3ForCausalLM", seed, num_hidden_layers=3)


def gemma2(*, seed: int = 0) -> nn.Module:
    return _built("Gemma2Config", "Gemma2ForCausalLM", seed, num_hidden_layers=3, sliding_window=8)


def gemma3(*, seed: int = 0) -> nn.Module:
    return _built("Gemma3TextConfig", "Gemma3ForCausalLM", seed, num_hidden_layers=6, sliding_window=8)


def qwen3_moe(*, seed: int = 0) -> nn.Module:
    return _built("Qwen3MoeConfig", "Qwen3MoeForCausalLM", seed, num_hidden_layers=3, moe_intermediate_size=32,
                  num_experts=4, num_experts_per_tok=2)


FAMILIES: dict[str, Callable[[], nn.Module]] = {
    "llama": llama, "qwen3": qwen3, "gemma2": gemma2, "gemma3": gemma3, "qwen3_moe": qwen3_moe}
