"""The generation demo's models: a tiny decoder that generates with a KV cache, and a port with a decode-only bug.

``DecodingLM`` is the demo's reference transformer (:mod:`tracediff.demo.models`:
RMSNorm, rotary attention, SwiGLU MLP, the same module names) given a KV cache
and a greedy ``generate``: the prefill reads the prompt, and every later
forward pass reads the one token it generated last, its rotary angles those of
that token's position (``start``).

``DecodingPort`` is the same model with the bug ports of generation code make
most: in decode steps its rotary embedding counts the new token twice and
rotates it one position late. The prefill is right, so a single forward pass
over the prompt passes; the first decode step diverges, at the prompt's
length, in layer 0's ``rope``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .models import DIM, HEADS, LAYERS, VOCAB, FeedForward, RMSNorm, _angles, _rotate_halves

PROMPT_LEN = 8
NEW_TOKENS = 6
#: Where the planted bug lives (path relative to the root), and where it first shows.
BUG_MODULE = "blocks.0.attn.rope"
BUG_STEP = 1
BUG_POSITION = PROMPT_LEN


class CachedRope(nn.Module):
    """Rotary embedding of ``(q, k)`` for tokens at positions ``start, start + 1, ...``."""

    def __init__(self, head_dim: int, *, late_decode: bool = False) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.late_decode = late_decode

    def forward(self, q: torch.Tensor, k: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        seq = q.shape[-2]
        if self.late_decode and seq == 1:
            start += 1  # the bug: the new token is counted as if it were already in the cache
        cos, sin = _angles(start + seq, self.head_dim)
        cos, sin = cos[start:], sin[start:]
        return _rotate_halves(q, cos, sin), _rotate_halves(k, cos, sin)


class CachedAttention(nn.Module):
    def __init__(self, *, late_decode: bool) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.rope = CachedRope(DIM // HEADS, late_decode=late_decode)
        self.cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (w(x).view(batch, seq, HEADS, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = self.rope(q, k, start)
        if start and self.cache is not None:
            k, v = torch.cat([self.cache[0], k], dim=-2), torch.cat([self.cache[1], v], dim=-2)
        self.cache = (k, v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        hidden = torch.ones(seq, start + seq, dtype=torch.bool).triu(start + 1)  # keys after each query
        weights = scores.masked_fill(hidden, float("-inf")).softmax(-1)
        return self.wo((weights @ v).transpose(1, 2).reshape(batch, seq, DIM))


class CachedBlock(nn.Module):
    def __init__(self, *, late_decode: bool) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(DIM)
        self.attn = CachedAttention(late_decode=late_decode)
        self.mlp_norm = RMSNorm(DIM)
        self.mlp = FeedForward()

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), start)
        return x + self.mlp(self.mlp_norm(x))


class DecodingLM(nn.Module):
    """The reference: ``embed``, ``blocks.N.{attn_norm, attn.{wq,wk,wv,wo,rope}, mlp_norm, mlp}``, ``norm``,
    ``head``."""

    late_decode = False

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([CachedBlock(late_decode=self.late_decode) for _ in range(LAYERS)])
        self.norm = RMSNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, start)
        return self.head(self.norm(x))

    @torch.no_grad()
    def generate(self, tokens: torch.Tensor, max_new_tokens: int = NEW_TOKENS) -> torch.Tensor:
        """Greedy decoding: the prefill reads ``tokens``, each later pass the last token chosen."""
        sequence, start, step_input = tokens, 0, tokens
        for _ in range(max_new_tokens):
            logits = self(step_input, start)
            chosen = logits[:, -1:].argmax(-1)
            start = sequence.shape[1]
            sequence = torch.cat([sequence, chosen], dim=1)
            step_input = chosen
        return sequence


class DecodingPort(DecodingLM):
    """The port: the reference's code, but decode steps rotate the new token one position late."""

    late_decode = True


def build_pair(*, seed: int = 0, plant_bug: bool = True) -> tuple[DecodingLM, DecodingLM]:
    """The reference with weights from ``seed`` and a port holding the same weights (with the bug, by default)."""
    with torch.random.fork_rng(devices=[]):  # leave the caller's random state alone
        torch.manual_seed(seed)
        reference = DecodingLM().eval()
        with torch.no_grad():
            for name, param in reference.named_parameters():
                if name.endswith("norm.weight"):
                    param.add_(0.1 * torch.randn_like(param))
        port = (DecodingPort() if plant_bug else DecodingLM()).eval()
    port.load_state_dict(reference.state_dict())
    return reference, port


def prompt_tokens(*, seed: int = 0) -> torch.Tensor:
    """A ``(1, PROMPT_LEN)`` prompt drawn from ``seed``."""
    return torch.randint(0, VOCAB, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(seed + 2))
