"""The demo's two implementations of one tiny decoder-only transformer.

``ReferenceLM`` is the original: token embeddings, pre-norm blocks of RMSNorm,
causal self-attention with rotary position embeddings (``rope``) and a SwiGLU
MLP, a final norm and an output head. Its module names follow one convention
(``blocks.0.attn.wq``).

``PortedLM`` is a rewrite of it in another convention
(``layers.0.self_attn.q_proj``, as in transformers' Llama), the way a port to
a new framework or library looks: the attention uses
``scaled_dot_product_attention`` instead of an explicit softmax (so some
tensors differ by rounding only), the activation is a module of its own
(``mlp.act_fn``, a node the reference does not have), and one bug can be
planted: its rotary embedding rotates interleaved pairs ``(x0, x1), (x2, x3)...``
instead of the two halves ``(x0, x[d/2])...``, a classic mistake when porting
between the GPT-NeoX and GPT-J conventions. Position 0 is not rotated, so the
bug only shows from the second token on.

``port_from_reference`` copies the reference's weights into a port through
:data:`RENAME_RULES`, the same rename map that lines up the two traces.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..maps.rules import apply_rename

VOCAB = 97
DIM = 32
HEADS = 4
HIDDEN = 64
LAYERS = 3
SEQ_LEN = 12
EPS = 1e-5

#: Rename rules from the reference's module paths (root removed) to the port's, applied in order.
RENAME_RULES: list[tuple[str, str]] = [
    (r"^embed$", "embed_tokens"),
    (r"^blocks\.(\d+)", r"layers.\1"),
    (r"\.attn_norm$", ".input_layernorm"),
    (r"\.mlp_norm$", ".post_attention_layernorm"),
    (r"\.attn(?=\.|$)", ".self_attn"),
    (r"\.wq$", ".q_proj"),
    (r"\.wk$", ".k_proj"),
    (r"\.wv$", ".v_proj"),
    (r"\.wo$", ".o_proj"),
    (r"\.rope$", ".rotary_emb"),
    (r"\.mlp\.w1$", ".mlp.gate_proj"),
    (r"\.mlp\.w3$", ".mlp.up_proj"),
    (r"\.mlp\.w2$", ".mlp.down_proj"),
    (r"^head$", "lm_head"),
]

#: Where the planted bug lives in the port (path relative to the root).
BUG_MODULE = "layers.0.self_attn.rotary_emb"


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _angles(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return freqs.cos(), freqs.sin()  # (seq_len, head_dim / 2) each


def _rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)


class Rope(nn.Module):
    """Rotary embedding of queries and keys, ``(q, k) -> (q, k)``, shapes ``(batch, heads, seq, head_dim)``."""

    def __init__(self, head_dim: int, *, interleaved: bool = False) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.interleaved = interleaved

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = _angles(q.shape[-2], self.head_dim)
        rotate = _rotate_pairs if self.interleaved else _rotate_halves
        return rotate(q, cos, sin), rotate(k, cos, sin)


# --- the reference ---------------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.rope = Rope(DIM // HEADS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (w(x).view(batch, seq, HEADS, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = self.rope(q, k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        weights = scores.masked_fill(causal, float("-inf")).softmax(-1)
        return self.wo((weights @ v).transpose(1, 2).reshape(batch, seq, DIM))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(DIM)
        self.attn = Attention()
        self.mlp_norm = RMSNorm(DIM)
        self.mlp = FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class ReferenceLM(nn.Module):
    """The original implementation: ``embed``, ``blocks.N.{attn_norm, attn.{wq,wk,wv,wo,rope}, ...}``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.norm = RMSNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# --- the port --------------------------------------------------------------------------------------


class SelfAttention(nn.Module):
    def __init__(self, *, interleaved_rope: bool) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.rotary_emb = Rope(DIM // HEADS, interleaved=interleaved_rope)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = hidden_states.shape
        q, k, v = (proj(hidden_states).view(batch, seq, HEADS, -1).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        q, k = self.rotary_emb(q, k)
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(context.transpose(1, 2).reshape(batch, seq, DIM))


class GatedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(DIM, HIDDEN, bias=False)
        self.up_proj = nn.Linear(DIM, HIDDEN, bias=False)
        self.down_proj = nn.Linear(HIDDEN, DIM, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, *, interleaved_rope: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(DIM)
        self.self_attn = SelfAttention(interleaved_rope=interleaved_rope)
        self.post_attention_layernorm = RMSNorm(DIM)
        self.mlp = GatedMLP()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = hidden_states + self.self_attn(hidden_states=self.input_layernorm(hidden_states))
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class PortedLM(nn.Module):
    """The port: ``embed_tokens``, ``layers.N.{input_layernorm, self_attn.{q_proj,...,rotary_emb}, ...}``.

    With ``plant_bug=True`` (default) every layer's rotary embedding uses the
    interleaved convention, so the first divergence is in layer 0's ``rotary_emb``.
    """

    def __init__(self, *, plant_bug: bool = True) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList([DecoderLayer(interleaved_rope=plant_bug) for _ in range(LAYERS)])
        self.norm = RMSNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return self.lm_head(self.norm(hidden_states))


def build_reference(*, seed: int = 0) -> ReferenceLM:
    """The reference with weights drawn from ``seed`` (norm weights perturbed so they matter), in eval mode."""
    with torch.random.fork_rng(devices=[]):  # leave the caller's random state alone
        torch.manual_seed(seed)
        model = ReferenceLM()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.add_(0.1 * torch.randn_like(param))
    return model.eval()


def port_from_reference(reference: ReferenceLM, *, plant_bug: bool = True) -> PortedLM:
    """A ``PortedLM`` holding ``reference``'s weights, each renamed through :data:`RENAME_RULES`."""
    with torch.random.fork_rng(devices=[]):  # its own initial weights are overwritten anyway
        port = PortedLM(plant_bug=plant_bug)
    state = {}
    for name, tensor in reference.state_dict().items():
        module, _, leaf = name.rpartition(".")
        state[f"{apply_rename(module, RENAME_RULES)}.{leaf}"] = tensor.clone()
    port.load_state_dict(state, strict=True)
    return port.eval()


def example_tokens(*, seed: int = 0) -> torch.Tensor:
    """A ``(1, SEQ_LEN)`` batch of token ids drawn from ``seed``."""
    generator = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, VOCAB, (1, SEQ_LEN), generator=generator)
