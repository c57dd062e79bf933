"""The two sides of a transformers -> mlx-lm port, as SPECs for ``tracediff capture`` (docs/frameworks.md).

    python docs/examples/mlx_port.py checkpoint/          # a tiny Llama checkpoint with random weights
    tracediff capture docs/examples/mlx_port.py:transformers_side --out traces/hf --save-inputs ids.safetensors
    tracediff capture docs/examples/mlx_port.py:mlx_side --out traces/mlx --inputs ids.safetensors
    tracediff align traces/hf traces/mlx

``CHECKPOINT`` (default ``checkpoint``) names the folder both sides load: any transformers checkpoint
mlx-lm supports, a real one included.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CHECKPOINT = Path(os.environ.get("CHECKPOINT", "checkpoint"))
PROMPT = [[1, 5, 9, 14, 3, 27, 8, 2]]


def transformers_side():
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.float32).eval()
    return model, {"input_ids": torch.tensor(PROMPT)}


def mlx_side():
    import mlx.core as mx
    from mlx_lm.utils import load_model

    model, _ = load_model(CHECKPOINT)
    return model, mx.array(PROMPT)


def save_tiny_llama(folder: Path) -> None:
    """A Llama of 2 layers with seeded random weights, saved as a transformers checkpoint."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(folder)


if __name__ == "__main__":
    save_tiny_llama(Path(sys.argv[1] if len(sys.argv) > 1 else CHECKPOINT))
