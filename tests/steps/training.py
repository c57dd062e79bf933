"""A real training loop for the step-recording tests: a tiny Llama with attention dropout, AdamW.

``train()`` runs it with or without a ``StepRecorder`` and can inject one
change at a chosen step: a different learning rate from that step on, a
reseeded torch RNG (different dropout masks), or one token of the batch
changed. Batches come from their own generator, so the global torch RNG
drives dropout only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from tracediff.steps import StepRecorder

VOCAB, SEQ_LEN, BATCH = 64, 8, 2
LR = 1e-3


def tiny_llama(*, dropout: float = 0.1, seed: int = 0) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
        use_cache=False, attn_implementation="eager", attention_dropout=dropout,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).train()


def batches(n: int, *, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ_LEN), generator=generator)
        out.append({"input_ids": ids, "labels": ids.clone()})
    return out


def train(
    out_dir: Path | None,
    *,
    steps: int = 6,
    lr_from: tuple[int, float] | None = None,
    reseed_at: tuple[int, int] | None = None,
    perturb_token_at: int | None = None,
    model: nn.Module | None = None,
    **recorder_options: Any,
) -> nn.Module:
    """Train a fresh tiny Llama for ``steps`` steps (recorded into ``out_dir`` unless None)."""
    model = model if model is not None else tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    torch.manual_seed(42)  # dropout masks
    recorder = StepRecorder(model, out_dir, optimizer=opt, **recorder_options) if out_dir is not None else None
    try:
        for k, batch in enumerate(batches(steps)):
            if lr_from is not None and k == lr_from[0]:
                for group in opt.param_groups:
                    group["lr"] = lr_from[1]
            if reseed_at is not None and k == reseed_at[0]:
                torch.manual_seed(reseed_at[1])
            if perturb_token_at == k:
                batch["input_ids"][0, 3] = (batch["input_ids"][0, 3] + 1) % VOCAB
            if recorder is None:
                _step(model, opt, batch)
            else:
                with recorder.step(batch):
                    _step(model, opt, batch)
    finally:
        if recorder is not None:
            recorder.close()
    return model


def _step(model: nn.Module, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> None:
    loss = model(**batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
