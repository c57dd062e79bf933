"""A timm-style vision transformer (A: ``patch_embed.proj`` convolution, class token and position embedding
as parameters, one fused ``qkv`` per block; ``tests/ports/research.py``) converted to transformers'
``ViTModel`` (B) as transformers' timm conversion script does (``qkv`` split into ``q_proj``, ``k_proj`` and
``v_proj``, keys renamed): the port where replay meets vision patches. timm itself is not a dependency.
"""

from __future__ import annotations

import torch
from torch import nn

from tests.ports.harness import Bug, Port, StateDict, swap, verdict_tests
from tests.ports.research import PatchViT, patch_vit_to_hf

IMAGE, PATCH, CHANNELS, DIM, LAYERS, HEADS, FFN = 16, 4, 3, 32, 3, 4, 64
IMAGES = torch.randn(1, CHANNELS, IMAGE, IMAGE, generator=torch.Generator().manual_seed(3))


def reference() -> nn.Module:
    model = PatchViT(image=IMAGE, patch=PATCH, channels=CHANNELS, dim=DIM, layers=LAYERS, heads=HEADS, hidden=FFN)
    with torch.no_grad():  # LayerNorms start at one and zero: make them count
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5) if name.endswith("weight") else param.uniform_(-0.5, 0.5)
    return model


def convert(model: nn.Module) -> StateDict:
    return patch_vit_to_hf(model.state_dict(), dim=DIM)


def port(state: StateDict) -> nn.Module:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(image_size=IMAGE, patch_size=PATCH, num_channels=CHANNELS, hidden_size=DIM,
                       num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
                       attn_implementation="sdpa")
    model = ViTModel(config, add_pooling_layer=False)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    return model


def images_for(model: nn.Module) -> torch.Tensor:
    """The images in the model's dtype (a bf16 port takes bf16 pixels)."""
    return IMAGES.to(next(model.parameters()).dtype)


def qk_swapped(state: StateDict) -> None:
    for kind in ("weight", "bias"):
        swap(state, f"layers.2.attention.q_proj.{kind}", f"layers.2.attention.k_proj.{kind}")


def ln_eps(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            module.eps = 1e-2


BUGS = (
    Bug("qk-swapped", "layer 2's q and k rows of qkv (weights and biases) swapped", "layers.2.attention",
        edit_state=qk_swapped),
    Bug("ln-eps", "LayerNorm eps 1e-2 instead of 1e-12 (every LayerNorm)", "layers.0.layernorm_before",
        edit_port=ln_eps),
    Bug("fc2-bias-missed", "layer 1's fc2 bias not copied (zero)", "layers.1.mlp.fc2",
        edit_state=lambda s: s.__setitem__("layers.1.mlp.fc2.bias", torch.zeros_like(s["layers.1.mlp.fc2.bias"]))),
)

HAND_MAP = {
    "rename": [
        ["^patch_embed$", "embeddings.patch_embeddings"],
        ["^embeddings\\.patch_embeddings\\.proj$", "embeddings.patch_embeddings.projection"],
        ["^blocks(?=\\.|$)", "layers"],
        ["\\.norm1$", ".layernorm_before"],
        ["\\.norm2$", ".layernorm_after"],
        ["\\.attn$", ".attention"],
        ["\\.attention\\.proj$", ".attention.o_proj"],
        ["\\.mlp\\.act$", ".mlp.activation_fn"],
        ["^norm$", "layernorm"],
    ],
}

PORT = Port(
    name="research_vit",
    reference=reference,
    convert=convert,
    port=port,
    run_reference=lambda model: model(images_for(model)),
    run_port=lambda model: model(pixel_values=images_for(model)),
    hand_map=HAND_MAP,
    bugs=BUGS,
    replay_bug="qk-swapped",
    ops_bug="ln-eps",
    ops_in=("blocks.0.norm1", "layers.0.layernorm_before"),
)

WRONG: dict[tuple[str, str], str] = {}


run, test_verdict = verdict_tests(PORT, WRONG)
