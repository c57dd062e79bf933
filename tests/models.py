"""Tiny models for tests and fixtures: transformers models from configs, and plain PyTorch toys.

Every builder fixes its seed, so two calls build bit-identical weights and
inputs. transformers is imported lazily: the plain PyTorch toys do not need it.

The toys cover what a capture must get right: containers (``ModuleList``,
``ModuleDict``), a module called three times in a loop, recursion, keyword
arguments, non-tensor arguments, and every shape of output (tensor, tuple,
list, dict, ``ModelOutput``, dataclass, ``None``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

VOCAB = 64
SEQ_LEN = 6


def _token_ids(seed: int, batch: int = 1, seq_len: int = SEQ_LEN) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, VOCAB, (batch, seq_len), generator=generator)


def tiny_llama(*, layers: int = 3, seed: int = 0) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A ``LlamaForCausalLM`` with hidden size 16, and keyword inputs ``input_ids``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
        use_cache=False, attn_implementation="eager",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval(), {"input_ids": _token_ids(seed)}


def tiny_gpt2(*, layers: int = 3, seed: int = 0) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A ``GPT2LMHeadModel`` with embedding size 16, and keyword inputs ``input_ids``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=layers, n_head=2, bos_token_id=0, eos_token_id=0,
        use_cache=False, attn_implementation="eager",
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config).eval(), {"input_ids": _token_ids(seed)}


def tiny_bert(*, layers: int = 3, seed: int = 0, hidden_act: str = "gelu") -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A ``BertModel`` with hidden size 16, and inputs ``input_ids`` and ``attention_mask``."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, attn_implementation="eager", hidden_act=hidden_act,
    )
    torch.manual_seed(seed)
    ids = _token_ids(seed)
    mask = torch.ones_like(ids)
    mask[:, -1] = 0  # one padded position, so the mask matters
    return BertModel(config).eval(), {"input_ids": ids, "attention_mask": mask}


HF_BUILDERS = {"llama": tiny_llama, "gpt2": tiny_gpt2, "bert": tiny_bert}


# --- plain PyTorch toys -------------------------------------------------------------------------


class SharedLoop(nn.Module):
    """One ``Linear`` applied three times in a loop, then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.tanh(self.shared(x))
        return self.head(x)


class Containers(nn.Module):
    """A ``ModuleList`` of blocks and a ``ModuleDict`` of heads; returns a dict of both heads."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3)])
        self.heads = nn.ModuleDict({"cls": nn.Linear(4, 3), "reg": nn.Linear(4, 1)})

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        for block in self.blocks:
            x = block(x)
        return {name: head(x) for name, head in self.heads.items()}


class Recursive(nn.Module):
    """Calls itself ``depth`` times: a recursion through one module path."""

    def __init__(self) -> None:
        super().__init__()
        self.step = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, depth: int = 2) -> torch.Tensor:
        x = self.step(x)
        return x if depth == 0 else self(x, depth=depth - 1)


class Chain(nn.Module):
    """``b(a(x))``: a's output tensor is b's input, unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class KwargsModel(nn.Module):
    """Keyword arguments of every kind: tensor, float, str, tuple, None, an arbitrary object."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0, mode: str = "add", sizes: tuple[int, ...] = (),
                mask: torch.Tensor | None = None, extra: Any = None) -> torch.Tensor:
        y = self.proj(x) * scale
        if mask is not None:
            y = y.masked_fill(~mask, 0.0)
        return y + x if mode == "add" else y


@dataclass
class Pair:
    """A dataclass output."""

    first: torch.Tensor
    second: torch.Tensor | None
    label: str


class OutputKinds(nn.Module):
    """Returns ``kind``-shaped outputs of one ``Linear``: tensor, tuple, list, dict, ModelOutput, dataclass, None."""

    KINDS = ("tensor", "tuple", "list", "dict", "model_output", "dataclass", "none")

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Any:
        y = self.proj(x)
        z = y * 2
        if self.kind == "tensor":
            return y
        if self.kind == "tuple":
            return (y, z)
        if self.kind == "list":
            return [y, z]
        if self.kind == "dict":
            return {"y": y, "z": z}
        if self.kind == "model_output":
            from transformers.modeling_outputs import BaseModelOutput

            return BaseModelOutput(last_hidden_state=y, hidden_states=(y, z))
        if self.kind == "dataclass":
            return Pair(first=y, second=z, label="pair")
        return None


class Boom(nn.Module):
    """Raises ``ValueError`` on its ``fail_on``-th call (0-based)."""

    def __init__(self, fail_on: int = 0) -> None:
        super().__init__()
        self.fail_on = fail_on
        self.calls = 0
        self.raised: ValueError | None = None  # the exception object, to check it propagates unchanged

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls - 1 == self.fail_on:
            self.raised = ValueError(f"boom at call {self.calls - 1}: shape {tuple(x.shape)}")
            raise self.raised
        return x + 1


class FailsInside(nn.Module):
    """``blocks.1.boom`` raises on its second call (the first call succeeds)."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.blocks = nn.ModuleList([nn.Identity(), nn.Sequential(nn.Linear(4, 4))])
        self.blocks[1].add_module("boom", Boom(fail_on=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pre(x)
        x = self.blocks[1].boom(x)
        return self.blocks[1].boom(self.blocks[1][0](x))


class CatchesInside(nn.Module):
    """A submodule raises and the model catches it and goes on: the forward succeeds."""

    def __init__(self) -> None:
        super().__init__()
        self.boom = Boom(fail_on=0)
        self.fallback = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return self.boom(x)
        except ValueError:
            return self.fallback(x)


class WrapSensitive(nn.Module):
    """Behaves differently when its ``forward`` has been replaced (as capture does)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        return y * 2 if "forward" in self.proj.__dict__ else y


CALL_COUNTER = {"n": 0}


class GlobalCounter(nn.Module):
    """Adds a global call count to its output: a second run differs from the first."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        CALL_COUNTER["n"] += 1
        return self.proj(x) + CALL_COUNTER["n"]


class WithDropout(nn.Module):
    """Dropout in training mode: random, yet reproducible from the same RNG state."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(x))


class Emit(nn.Module):
    """Returns the tensor it was built with: lets a test choose exact values and dtypes."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        self.value = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.value


class EmitAll(nn.Module):
    """One ``Emit`` child per given tensor, named ``e0``, ``e1``, ..."""

    def __init__(self, values: list[torch.Tensor]) -> None:
        super().__init__()
        self.emitters = nn.ModuleList([Emit(v) for v in values])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [emit(x) for emit in self.emitters]


def seeded(module_cls: type[nn.Module], *args: Any, seed: int = 0) -> nn.Module:
    """Build ``module_cls(*args)`` with ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return module_cls(*args)


def toy_input(seed: int = 0, rows: int = 2) -> torch.Tensor:
    """A ``(rows, 4)`` float32 input drawn from a seeded generator."""
    return torch.randn(rows, 4, generator=torch.Generator().manual_seed(seed + 100))
