"""Float models for the attribution tests, the validation table and the benchmark, with their quantizers.

All are built from configs with random weights and fixed seeds. Two things
make a ranking meaningful on random weights:

* **Layers of different weight.** With i.i.d. initialisation every layer
  costs about the same (within +-30%), and the one-at-a-time scan's own order
  then changes with the input batch: there is nothing to rank. Trained models
  are not like that (norms and sensitivities change with depth), so each
  layer's residual-branch outputs (``o_proj``, ``down_proj``; ``fc2``) are
  scaled by a factor drawn log-uniformly from [1/4, 4] with a fixed seed.
* **An outlier channel** (``outlier=k``): in layer k, one channel of the
  RMSNorm gains before the attention and the MLP is 40x the others, as the
  outlier features of real LLMs are. The projections that read it see one
  huge input channel: per-token int8 activations lose the others' precision,
  and a weight's quantization error in that column is multiplied by 40.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

VOCAB = 256
SEQ = 32
OUTLIER_GAIN = 40.0


def token_ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(seed))


def _layer_scales(layers: int, seed: int) -> torch.Tensor:
    return torch.exp(torch.empty(layers).uniform_(-1.386, 1.386, generator=torch.Generator().manual_seed(seed)))


def llama(*, layers: int = 6, seed: int = 0, outlier: int | None = None, spread: bool = True) -> nn.Module:
    """A ``LlamaForCausalLM`` with hidden size 64 (int4 groups of 32 fit), eager attention, no cache."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
                         attn_implementation="eager")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            if spread:
                scale = float(_layer_scales(layers, seed + 1)[i])
                layer.self_attn.o_proj.weight.mul_(scale)
                layer.mlp.down_proj.weight.mul_(scale)
            if i == outlier:
                layer.input_layernorm.weight[7] = OUTLIER_GAIN
                layer.post_attention_layernorm.weight[7] = OUTLIER_GAIN
    return model


class Block(nn.Module):
    """A pre-norm residual MLP block: ``x + fc2(gelu(fc1(norm(x))))``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


class MLPStack(nn.Module):
    """An MLP-heavy regressor: a Linear in, residual MLP blocks, a Linear out (no logits: relative mse)."""

    def __init__(self, width: int = 64, layers: int = 6) -> None:
        super().__init__()
        self.proj_in = nn.Linear(16, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.proj_out = nn.Linear(width, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj_in(x)
        for block in self.blocks:
            h = block(h)
        return self.proj_out(h)


def mlp_stack(*, layers: int = 6, seed: int = 0, outlier: int | None = None, spread: bool = True) -> nn.Module:
    torch.manual_seed(seed)
    model = MLPStack(layers=layers).eval()
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            if spread:
                block.fc2.weight.mul_(float(_layer_scales(layers, seed + 1)[i]))
            if i == outlier:
                block.norm.weight[7] = OUTLIER_GAIN
    return model


def mlp_inputs(seed: int = 1) -> torch.Tensor:
    return torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(seed))


# --- quantizers: quantize(model, path) changes the Linears under ``path`` in place ("" for all) --------------

def _under(path: str) -> Callable[[nn.Module, str], bool]:
    def wanted(module: nn.Module, fqn: str) -> bool:
        return isinstance(module, nn.Linear) and (not path or fqn == path or fqn.startswith(f"{path}.")) \
            and "lm_head" not in fqn
    return wanted


def torchao(kind: str) -> Callable[[nn.Module, str], None]:
    """torchao's ``quantize_`` with int8 weight-only, int8 dynamic activations + int8 weights, or int4 weight-only
    (groups of 32, the CPU packing)."""
    from torchao.quantization import (
        Int4WeightOnlyConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        quantize_,
    )

    def config() -> object:
        if kind == "int8wo":
            return Int8WeightOnlyConfig()
        if kind == "int8dyn":
            return Int8DynamicActivationInt8WeightConfig()
        if kind == "int4wo":
            return Int4WeightOnlyConfig(group_size=32, int4_packing_format="opaque")
        raise ValueError(kind)

    def quantize(model: nn.Module, path: str) -> None:
        quantize_(model, config(), filter_fn=_under(path))
    return quantize


def quanto(kind: str) -> Callable[[nn.Module, str], None]:
    """optimum-quanto's ``quantize`` + ``freeze`` with qint8 or qint4 weights."""
    from optimum.quanto import freeze, qint4, qint8, quantize

    weights = {"qint8": qint8, "qint4": qint4}[kind]

    def run(model: nn.Module, path: str) -> None:
        names = [name for name, m in model.named_modules() if _under(path)(m, name)]
        quantize(model, weights=weights, include=names)
        freeze(model)
    return run
