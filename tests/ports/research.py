"""Research-style references for the real-port suite, written the way research repositories write them.

Two models whose layout transformers does not share:

- ``FusedLlama``: a Llama in the style of lit-gpt (``transformer.h.N.attn.qkv``, one fused q/k/v
  projection, grouped-query attention, rotary tables computed once in the model's own code and passed to
  every block by position, a boolean keep-mask, ``scaled_dot_product_attention``);
- ``PatchViT``: a vision transformer in the style of timm's ``VisionTransformer`` (``patch_embed.proj``
  convolution, class token and position embedding as parameters, ``blocks.N.attn.qkv`` fused,
  ``scaled_dot_product_attention``).

Both convert into transformers (``LlamaForCausalLM``, ``ViTModel``) by splitting the fused projection
and renaming keys, as lit-gpt's ``convert_lit_checkpoint`` and transformers' timm conversion script do.
Neither library is a dependency of the suite: the two references are restated here, small and seeded.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

StateDict = dict[str, torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (norm * self.weight).to(x.dtype)


def rope_cache(seq: int, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    theta = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.outer(torch.arange(seq).float(), theta).repeat(1, 2)
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class FusedAttention(nn.Module):
    def __init__(self, dim: int, heads: int, groups: int) -> None:
        super().__init__()
        self.heads, self.groups, self.head_dim = heads, groups, dim // heads
        self.qkv = nn.Linear(dim, (heads + 2 * groups) * self.head_dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.head_dim, self.groups * self.head_dim,
                                     self.groups * self.head_dim], dim=-1)
        q = q.view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, seq, self.groups, self.head_dim).transpose(1, 2)
        v = v.view(batch, seq, self.groups, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k = k.repeat_interleave(self.heads // self.groups, dim=1)
        v = v.repeat_interleave(self.heads // self.groups, dim=1)
        # no mask given: causal by the kernel's own flag, as most research code writes it
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           scale=1.0 / math.sqrt(self.head_dim))
        return self.proj(y.transpose(1, 2).reshape(batch, seq, dim))


class LlamaMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc_1 = nn.Linear(dim, hidden, bias=False)
        self.fc_2 = nn.Linear(dim, hidden, bias=False)
        self.proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.silu(self.fc_1(x)) * self.fc_2(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, groups: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.norm_1 = RMSNorm(dim, eps)
        self.attn = FusedAttention(dim, heads, groups)
        self.norm_2 = RMSNorm(dim, eps)
        self.mlp = LlamaMLP(dim, hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm_1(x), cos, sin, mask)
        return x + self.mlp(self.norm_2(x))


class FusedLlama(nn.Module):
    """lit-gpt's ``GPT`` for a Llama config, restated: ``forward(idx)`` returns the logits. Without ``keep_mask``
    the blocks take ``(x, cos, sin)`` and the attention is causal by ``is_causal`` (no mask tensor at all)."""

    def __init__(self, *, vocab: int, layers: int, dim: int, heads: int, groups: int, hidden: int,
                 eps: float = 1e-5, base: float = 10000.0, max_seq: int = 16, keep_mask: bool = True) -> None:
        super().__init__()
        self.keep_mask = keep_mask
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(vocab, dim),
            "h": nn.ModuleList(Block(dim, heads, groups, hidden, eps) for _ in range(layers)),
            "ln_f": RMSNorm(dim, eps),
        })
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        cos, sin = rope_cache(max_seq, dim // heads, base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        seq = idx.size(1)
        cos, sin = self.cos[:seq], self.sin[:seq]
        # a boolean keep-mask: True where a position may attend
        mask = torch.ones(seq, seq, dtype=torch.bool, device=idx.device).tril()[None, None]
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x, cos, sin, mask) if self.keep_mask else block(x, cos, sin)
        return self.lm_head(self.transformer.ln_f(x))


def fused_llama_to_hf(state: StateDict, *, heads: int, groups: int, dim: int) -> StateDict:
    """lit-gpt's ``copy_weights_llama`` (lit -> Hugging Face), restated: renames, and ``qkv`` split in three."""
    head_dim = dim // heads
    names = {"transformer.wte.weight": "model.embed_tokens.weight", "transformer.ln_f.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
    per_layer = {"norm_1.weight": "input_layernorm.weight", "norm_2.weight": "post_attention_layernorm.weight",
                 "attn.proj.weight": "self_attn.o_proj.weight", "mlp.fc_1.weight": "mlp.gate_proj.weight",
                 "mlp.fc_2.weight": "mlp.up_proj.weight", "mlp.proj.weight": "mlp.down_proj.weight"}
    out: StateDict = {}
    for key, value in state.items():
        if key in names:
            out[names[key]] = value
            continue
        _, _, layer, rest = key.split(".", 3)
        prefix = f"model.layers.{layer}."
        if rest == "attn.qkv.weight":
            q, k, v = value.split([heads * head_dim, groups * head_dim, groups * head_dim])
            out[prefix + "self_attn.q_proj.weight"] = q
            out[prefix + "self_attn.k_proj.weight"] = k
            out[prefix + "self_attn.v_proj.weight"] = v
        else:
            out[prefix + per_layer[rest]] = value
    return out


# --- a vision transformer ---------------------------------------------------------------------------------


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, channels: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class ViTAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        qkv = self.qkv(x).reshape(batch, seq, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, dim))


class ViTMlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = ViTAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = ViTMlp(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchViT(nn.Module):
    """timm's ``VisionTransformer`` without a head, restated: ``forward(images)`` returns the normed tokens."""

    def __init__(self, *, image: int, patch: int, channels: int, dim: int, layers: int, heads: int, hidden: int,
                 eps: float = 1e-12) -> None:
        super().__init__()
        self.patch_embed = PatchEmbed(patch, channels, dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.5)
        self.blocks = nn.ModuleList(ViTBlock(dim, heads, hidden, eps) for _ in range(layers))
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images)
        x = torch.cat([self.cls_token.expand(x.size(0), -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def patch_vit_to_hf(state: StateDict, *, dim: int) -> StateDict:
    """transformers' ``convert_vit_timm_to_pytorch.py`` (``create_rename_keys``, ``read_in_q_k_v``), restated
    for a model without a head and for transformers 5's module names (``layers.N.attention.q_proj``): renames,
    and ``qkv`` split into q, k and v."""
    names = {"cls_token": "embeddings.cls_token", "pos_embed": "embeddings.position_embeddings",
             "patch_embed.proj.weight": "embeddings.patch_embeddings.projection.weight",
             "patch_embed.proj.bias": "embeddings.patch_embeddings.projection.bias",
             "norm.weight": "layernorm.weight", "norm.bias": "layernorm.bias"}
    per_layer = {"norm1": "layernorm_before", "norm2": "layernorm_after", "attn.proj": "attention.o_proj",
                 "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
    out: StateDict = {}
    for key, value in state.items():
        if key in names:
            out[names[key]] = value
            continue
        _, layer, rest = key.split(".", 2)
        module, kind = rest.rsplit(".", 1)
        prefix = f"layers.{layer}."
        if module == "attn.qkv":
            for part, name in zip(value.split(dim), ("q_proj", "k_proj", "v_proj")):
                out[f"{prefix}attention.{name}.{kind}"] = part
        else:
            out[f"{prefix}{per_layer[module]}.{kind}"] = value
    return out
