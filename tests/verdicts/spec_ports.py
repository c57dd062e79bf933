"""SPEC functions for ``tracediff capture``: the fp32 reference and a bf16 port with a bug in layer 1."""

from __future__ import annotations

from typing import Any

from tests.verdicts.ports import IDS, build, plant


def reference() -> tuple[Any, dict[str, Any]]:
    return build("llama", layers=2), {"input_ids": IDS}


def buggy_port() -> tuple[Any, dict[str, Any]]:
    import torch

    model = plant(build("llama", attn="eager", layers=2), "scaled-weight", 1).to(torch.bfloat16)
    return model, {"input_ids": IDS}
