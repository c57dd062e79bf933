"""Tiny transformers Llama models with bugs planted inside an attention ``forward``, for op-level tests.

``attention_forward`` is a plain-PyTorch Llama attention (explicit
``matmul`` + ``softmax``, ``repeat_interleave`` for grouped-query heads),
bound in place of ``LlamaAttention.forward`` on chosen layers, with one of
the planted bugs:

* ``rotary_q_only``: the rotary embedding is applied to q only;
* ``gqa_mapping``: key/value heads repeated with ``repeat`` (k0 k1 k0 k1)
  instead of ``repeat_interleave`` (k0 k0 k1 k1);
* ``scale``: scores scaled by ``1 / head_dim`` instead of ``head_dim ** -0.5``.

and one variant that is no bug: ``scale_first`` scales q before ``q @ k^T``
instead of the scores after it (the same math in another order).

The ``build_*`` functions are capture SPECs (``ops_models.py:build_port_scale``).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch
from torch import nn

SEQ_LEN = 6
BUGS = ("rotary_q_only", "gqa_mapping", "scale")


def tiny_llama(attn: str = "eager", *, seed: int = 0) -> nn.Module:
    """A 2-layer ``LlamaModel``: hidden size 32, 4 query heads, 2 key/value heads."""
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         use_cache=False, attn_implementation=attn)
    torch.manual_seed(seed)
    return LlamaModel(config).eval()


def input_ids() -> torch.Tensor:
    return torch.randint(0, 64, (1, SEQ_LEN), generator=torch.Generator().manual_seed(1))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention_forward(self: nn.Module, hidden_states: torch.Tensor,
                      position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                      attention_mask: torch.Tensor | None = None, *, bug: str | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama attention written out op by op, with an optional planted ``bug``."""
    batch, seq, _ = hidden_states.shape
    shape = (batch, seq, -1, self.head_dim)
    q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
    k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
    v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
    assert position_embeddings is not None
    cos, sin = (t.unsqueeze(1) for t in position_embeddings)
    q = q * cos + _rotate_half(q) * sin
    if bug != "rotary_q_only":
        k = k * cos + _rotate_half(k) * sin
    n_rep = self.num_key_value_groups
    if bug == "gqa_mapping":
        k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)
    else:
        k, v = torch.repeat_interleave(k, n_rep, dim=1), torch.repeat_interleave(v, n_rep, dim=1)
    scale = 1.0 / self.head_dim if bug == "scale" else self.head_dim ** -0.5
    if bug == "scale_first":
        scores = torch.matmul(q * scale, k.transpose(2, 3))
    else:
        scores = torch.matmul(q, k.transpose(2, 3)) * scale
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v).transpose(1, 2).reshape(batch, seq, -1)
    return self.o_proj(out), probs


def plant(model: nn.Module, layers: list[int], bug: str | None = None) -> nn.Module:
    """Replace the attention forward of ``layers`` by ``attention_forward`` with ``bug``."""
    for index in layers:
        attn = model.layers[index].self_attn
        attn.forward = types.MethodType(functools.partial(attention_forward, bug=bug), attn)
    return model


def reference() -> nn.Module:
    """The stock transformers model (eager attention)."""
    return tiny_llama("eager")


def port(bug: str) -> nn.Module:
    """The same weights, layer 1's attention rewritten with ``bug``."""
    return plant(tiny_llama("eager"), [1], bug)


def build_reference() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return reference(), {"input_ids": input_ids()}


def build_port_scale() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return port("scale"), {"input_ids": input_ids()}
