"""Tiny language models that generate, and ports of them with generation-only bugs.

Each builder fixes its seed, so the reference and every port share bit-identical weights. The bugs show
only once decoding starts (or past a position), never in the prefill of a short prompt:

* ``rotary_offset``: the rotary embedding of decode steps is computed one position late;
* ``kv_transposed``: layer 1 stores its prompt keys in the cache with heads and positions transposed;
* ``mask_off_by_one``: for decode steps the causal mask hides the newest key (the token itself);
* ``sliding_window_late``: a Mistral whose sliding window reaches one position further back;
* ``gpt2_position_offset``: GPT-2's learned position embedding of decode steps is read one position early.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

VOCAB = 64
PROMPT = 6
NEW_TOKENS = 5
WINDOW = 8


def prompt(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(seed + 1))


def llama(seed: int = 0) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="eager", pad_token_id=0, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def mistral(seed: int = 0, window: int = WINDOW) -> nn.Module:
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                           sliding_window=window, attn_implementation="eager", pad_token_id=0,
                           bos_token_id=None, eos_token_id=None)
    torch.manual_seed(seed)
    return MistralForCausalLM(config).eval()


def gpt2(seed: int = 0) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                        attn_implementation="eager", pad_token_id=0, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config).eval()


def generate_kwargs(**extra: Any) -> dict[str, Any]:
    """Greedy, exactly ``NEW_TOKENS`` new tokens (no end-of-sequence token stops it early)."""
    return {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS, "do_sample": False, **extra}


def _decode(position_ids: Any) -> bool:
    return isinstance(position_ids, torch.Tensor) and position_ids.shape[-1] == 1


def rotary_offset(model: nn.Module) -> nn.Module:
    rotary = model.model.rotary_emb
    original = rotary.forward

    def forward(x: torch.Tensor, position_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return original(x, position_ids + 1 if _decode(position_ids) else position_ids, *args, **kwargs)

    rotary.forward = forward
    return model


def kv_transposed(model: nn.Module, layer: int = 1) -> nn.Module:
    attention = model.model.layers[layer].self_attn
    original = attention.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        stored = cache.layers[layer] if cache is not None else None
        if stored is not None and stored.keys.shape[-2] == PROMPT:  # the prompt's keys, just written
            keys = stored.keys
            stored.keys = keys.transpose(1, 2).reshape(keys.shape)  # heads and positions mixed up
        return out

    attention.forward = forward
    return model


def mask_off_by_one(model: nn.Module) -> nn.Module:
    for block in model.model.layers:
        attention = block.self_attn
        original = attention.forward

        def forward(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
            mask = kwargs.get("attention_mask")
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            if hidden is not None and hidden.shape[1] == 1 and mask is not None:
                mask = mask.clone()
                mask[..., -1] = torch.finfo(mask.dtype).min  # the newest key hidden from its own query
                kwargs["attention_mask"] = mask
            return __original(*args, **kwargs)

        attention.forward = forward
    return model


def sliding_window_late(seed: int = 0) -> nn.Module:
    return mistral(seed, window=WINDOW + 1)


def gpt2_position_offset(model: nn.Module) -> nn.Module:
    wpe = model.transformer.wpe
    original = wpe.forward

    def forward(positions: torch.Tensor) -> torch.Tensor:
        return original(positions - 1 if positions.shape[-1] == 1 else positions)

    wpe.forward = forward
    return model
