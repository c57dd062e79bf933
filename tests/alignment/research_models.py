"""Reference implementations written the way research code is, to port onto transformers' Llama.

``ResearchLlama`` computes what ``tests.alignment.helpers.llama()`` computes
(eager attention, GQA: 4 query heads, 2 key/value heads) with the habits of
research code: a fused ``qkv`` projection and a fused ``gate_up`` projection,
the rotary tables computed inside each attention (``attn.rotary``, called with
nanoGPT-style position ids of shape ``[T]``), other module names and a tensor
output instead of a ``ModelOutput``. ``from_llama`` copies a Llama's weights
in, so the two agree to float32 rounding.
"""

from __future__ import annotations

import torch
from torch import nn

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 32, 4, 2, 8, 64


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


class Rotary(nn.Module):
    """cos and sin tables ``[T, head_dim]`` for positions ``[T]``."""

    def __init__(self, theta: float = 10000.0) -> None:
        super().__init__()
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float) / HEAD_DIM))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, theta: float) -> None:
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.rotary = Rotary(theta)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        q = q.view(b, t, HEADS, HEAD_DIM).transpose(1, 2)
        k = k.view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = v.view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        cos, sin = self.rotary(x, positions)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        scores = q @ k.transpose(2, 3) * HEAD_DIM ** -0.5
        scores = scores + torch.full((t, t), torch.finfo(x.dtype).min).triu(1)
        out = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, HEADS * HEAD_DIM))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_up = nn.Linear(HIDDEN, 2 * INTERMEDIATE, bias=False)
        self.act = nn.SiLU()
        self.down = nn.Linear(INTERMEDIATE, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)


class Block(nn.Module):
    def __init__(self, theta: float) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(HIDDEN)
        self.attn = Attention(theta)
        self.mlp_norm = RMSNorm(HIDDEN)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), positions)
        return x + self.mlp(self.mlp_norm(x))


class ResearchLlama(nn.Module):
    def __init__(self, layers: int = 2, vocab: int = 100, theta: float = 10000.0) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, HIDDEN)
        self.blocks = nn.ModuleList([Block(theta) for _ in range(layers)])
        self.norm = RMSNorm(HIDDEN)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1])  # nanoGPT: [T], not [1, T]
        x = self.tok_embeddings(idx)
        for block in self.blocks:
            x = block(x, positions)
        return self.norm(x)


def from_llama(llama: nn.Module, theta: float = 10000.0) -> ResearchLlama:
    """A ``ResearchLlama`` holding exactly the weights of a transformers ``LlamaModel``."""
    model = ResearchLlama(layers=len(llama.layers), theta=theta).eval()
    with torch.no_grad():
        model.tok_embeddings.weight.copy_(llama.embed_tokens.weight)
        model.norm.weight.copy_(llama.norm.weight)
        for mine, theirs in zip(model.blocks, llama.layers):
            attn = theirs.self_attn
            mine.attn.qkv.weight.copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
            mine.attn.proj.weight.copy_(attn.o_proj.weight)
            mine.attn_norm.weight.copy_(theirs.input_layernorm.weight)
            mine.mlp_norm.weight.copy_(theirs.post_attention_layernorm.weight)
            mlp = theirs.mlp
            mine.mlp.gate_up.weight.copy_(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
            mine.mlp.down.weight.copy_(mlp.down_proj.weight)
    return model


# The map a porting engineer writes for ResearchLlama -> LlamaModel: module renames, and the rotary
# tables that one side computes in every attention and the other once per forward.
RESEARCH_MAP = {
    "rename": [
        [r"^tok_embeddings$", "embed_tokens"],
        [r"^blocks\.0\.attn\.rotary$", "rotary_emb"],
        [r"^blocks(?=\.|$)", "layers"],
        [r"^(layers\.\d+\.)attn_norm$", r"\1input_layernorm"],
        [r"^(layers\.\d+\.)mlp_norm$", r"\1post_attention_layernorm"],
        [r"^(layers\.\d+\.)attn(?=\.|$)", r"\1self_attn"],
        [r"^(layers\.\d+\.self_attn\.)proj$", r"\1o_proj"],
        [r"^(layers\.\d+\.mlp\.)act$", r"\1act_fn"],
        [r"^(layers\.\d+\.mlp\.)down$", r"\1down_proj"],
    ],
    # the rotary module's first argument only carries the dtype: set it aside
    "slots": [[r"^(blocks|layers)\.\d+(\.attn)?$", "inputs.args.1", "inputs.kwargs.position_ids"],
              [r"rotary", "inputs.args.0", ""]],
}
