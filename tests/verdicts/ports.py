"""Tiny transformers models as a porting engineer compares them: a reference, its low-precision
baseline, clean ports with another attention kernel, and ports with planted bugs.

Every build starts from the same seed, so weights agree bit for bit before the cast; a bug is a
deliberate change to one module. ``initializer_range`` is larger than transformers' default so that
attention is not uniform and a wrong attention scale changes the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

import tracediff

VOCAB = 96
SEQ = 12
IDS = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(3))


def build(arch: str, *, attn: str = "sdpa", layers: int = 3, seed: int = 0) -> nn.Module:
    """An fp32 ``arch`` model ("llama", "gpt2", "bert") with hidden size 32 and 4 heads."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, num_hidden_layers=layers, num_attention_heads=4, hidden_size=32,
                  intermediate_size=64, max_position_embeddings=32, initializer_range=0.1, attn_implementation=attn)
    if arch == "llama":
        config = tf.LlamaConfig(num_key_value_heads=2, use_cache=False, **common)
        cls: type[nn.Module] = tf.LlamaModel
    elif arch == "gpt2":
        config = tf.GPT2Config(vocab_size=VOCAB, n_layer=layers, n_head=4, n_embd=32, n_positions=32,
                               initializer_range=0.1, use_cache=False, attn_implementation=attn)
        cls = tf.GPT2Model
    else:
        config = tf.BertConfig(**common)
        cls = tf.BertModel
    torch.manual_seed(seed)
    return cls(config).eval()


def layer(model: nn.Module, index: int) -> nn.Module:
    return model.layers[index] if hasattr(model, "layers") else (
        model.h[index] if hasattr(model, "h") else model.encoder.layer[index])


def mlp_out(model: nn.Module, index: int) -> nn.Linear:
    """The last Linear of a layer's MLP: ``mlp.down_proj``, ``mlp.c_proj`` or ``output.dense``."""
    block = layer(model, index)
    if hasattr(block, "mlp"):
        return block.mlp.down_proj if hasattr(block.mlp, "down_proj") else block.mlp.c_proj
    return block.output.dense


def attention(model: nn.Module, index: int) -> nn.Module:
    block = layer(model, index)
    return block.self_attn if hasattr(block, "self_attn") else (
        block.attn if hasattr(block, "attn") else block.attention.self)


def norm(model: nn.Module, index: int) -> nn.Module:
    block = layer(model, index)
    return block.input_layernorm if hasattr(block, "input_layernorm") else (
        block.ln_1 if hasattr(block, "ln_1") else block.attention.output.LayerNorm)


class MeanAbsNorm(nn.Module):
    """A wrong norm formula: divides by mean |x| instead of the root mean square (or the std)."""

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        self.weight = original.weight
        self.bias = getattr(original, "bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x / (x.abs().mean(-1, keepdim=True) + 1e-6) * self.weight
        return y + self.bias if self.bias is not None else y


def plant(model: nn.Module, bug: str, index: int) -> nn.Module:
    """Plant one bug in layer ``index``: ``scaled-weight`` (x1.25; ``scaled-weight-5%``: x1.05),
    ``wrong-norm`` (mean |x|), ``attention-scale`` (1/d instead of 1/sqrt(d)), ``norm-eps`` (the
    benign-looking kind: eps 3e-4 instead of the configured 1e-6 or 1e-5)."""
    if bug in ("scaled-weight", "scaled-weight-5%"):
        with torch.no_grad():
            mlp_out(model, index).weight.mul_(1.25 if bug == "scaled-weight" else 1.05)
    elif bug == "attention-scale":
        attn = attention(model, index)
        attn.scaling = attn.scaling ** 2
    elif bug == "wrong-norm":
        block = layer(model, index)
        original = norm(model, index)
        for name, child in block.named_modules():
            if child is original:
                parent = block.get_submodule(name.rpartition(".")[0]) if "." in name else block
                setattr(parent, name.rpartition(".")[2], MeanAbsNorm(original))
    elif bug == "norm-eps":
        target = norm(model, index)
        if hasattr(target, "variance_epsilon"):
            target.variance_epsilon = 3e-4
        else:
            target.eps = 3e-4
    else:
        raise ValueError(bug)
    return model


def capture(model: nn.Module, out: Path, dtype: torch.dtype = torch.float32) -> Path:
    model = model.to(dtype)
    inputs = {"input_ids": IDS}
    with torch.no_grad(), tracediff.capture(model, out):
        model(**inputs)
    return out


def port(arch: str, out: Path, *, dtype: torch.dtype, attn: str = "eager",
         bugs: Sequence[tuple[str, int]] = ()) -> Path:
    model = build(arch, attn=attn)
    for bug, index in bugs:
        plant(model, bug, index)
    return capture(model, out, dtype)
