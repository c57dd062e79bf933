"""References and ports for the replay tests: tiny transformers models and plain-PyTorch models.

Every builder fixes its seed, so a port starts with the reference's weights;
a bug is one deliberate change. The functions without arguments are SPECs for
``tracediff replay`` (``tests.replaying.ports:exact_llama``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

VOCAB = 64
IDS = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(1))


def llama(*, attn: str = "eager", dtype: torch.dtype = torch.float32, init: float = 0.3) -> nn.Module:
    """A 3-layer ``LlamaForCausalLM``, hidden size 16; ``init`` large enough for attention to matter."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32, use_cache=False,
                         attn_implementation=attn, initializer_range=init)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval().to(dtype)


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2, use_cache=False,
                        attn_implementation="eager")
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


def bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, attn_implementation="eager")
    torch.manual_seed(0)
    return BertModel(config).eval()


BERT_MASK = torch.tensor([[1, 1, 1, 1, 1, 0]])


# --- SPECs for the command line -----------------------------------------------------------------------------


def exact_llama() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return llama(), {"input_ids": IDS}


def two_bugs_llama() -> nn.Module:
    """A benign eps change in layer 0's input norm and a scaled weight in layer 2's down_proj."""
    model = llama()
    model.model.layers[0].input_layernorm.variance_epsilon = 1e-2
    with torch.no_grad():
        model.model.layers[2].mlp.down_proj.weight.mul_(1.05)
    return model


def not_a_model() -> int:
    return 3


# --- plain PyTorch ------------------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x))


class LeakyResidualBlock(Block):
    """The bug sits between the submodule calls: the residual is scaled."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.9 * x + self.fc(self.norm(x))


class Net(nn.Module):
    def __init__(self, block: type[Block] = Block) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([Block(), block(), Block()])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def net(block: type[Block] = Block) -> nn.Module:
    torch.manual_seed(0)
    return Net(block).eval()



class RenamedNet(nn.Module):
    """``Net`` under other names (``layers`` for ``blocks``, ``out`` for ``head``), with the same weights."""

    def __init__(self, block: type[Block] = Block) -> None:
        super().__init__()
        source = Net(block)
        self.embed, self.layers, self.out = source.embed, source.blocks, source.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def renamed_leaky_net() -> nn.Module:
    torch.manual_seed(0)
    return RenamedNet(LeakyResidualBlock).eval()

class Scaler(nn.Module):
    """Keyword arguments of every kind: tensors, a tuple of tensors, a float, a str, a tuple of ints, None."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, pair: tuple[torch.Tensor, torch.Tensor], scale: float = 1.0,
                mode: str = "add", sizes: tuple[int, ...] = (), mask: torch.Tensor | None = None,
                extra: Any = None) -> torch.Tensor:
        y = self.proj(x) * scale + pair[0] * pair[1]
        if mask is not None:
            y = y.masked_fill(~mask, 0.0)
        y = y.reshape(sizes) if sizes else y
        return y + x.reshape(y.shape) if mode == "add" else y


class Opaque:
    """An argument the trace can only keep as a repr."""

    def __repr__(self) -> str:
        return "Opaque()"


class KwargsNet(nn.Module):
    def __init__(self, extra: Any = None) -> None:
        super().__init__()
        self.scaler = Scaler()
        self.extra = extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scaler(x, pair=(x.sin(), x.cos()), scale=0.5, mode="add", sizes=(2, 2, 4), mask=None,
                           extra=self.extra)


def kwargs_net(extra: Any = None) -> nn.Module:
    torch.manual_seed(0)
    return KwargsNet(extra).eval()


def toy_input() -> torch.Tensor:
    return torch.randn(4, 4, generator=torch.Generator().manual_seed(3))


class Elsewhere(nn.Module):
    """A model that shares no module name with the others here and cannot take their inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.other = nn.Linear(3, 3)

    def forward(self, tokens: torch.Tensor, *, required: torch.Tensor) -> torch.Tensor:
        return self.other(tokens) + required


def elsewhere() -> nn.Module:
    torch.manual_seed(0)
    return Elsewhere().eval()
