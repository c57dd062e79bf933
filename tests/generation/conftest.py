"""Generation traces shared by the tests of this folder: captured once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import tracediff

from . import ports


def capture_generation(model: torch.nn.Module, out: Path, **options: Any) -> tracediff.CaptureSession:
    with torch.no_grad(), tracediff.capture(model, out, **options) as session:
        model.generate(ports.prompt(), **ports.generate_kwargs())
    return session


@pytest.fixture(scope="session")
def generation_traces(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``traces(name)``: the folder of a generation captured once, by name (see ``_BUILDERS``)."""
    root = tmp_path_factory.mktemp("generation")
    made: dict[str, Path] = {}

    def trace(name: str) -> Path:
        if name not in made:
            made[name] = root / name
            capture_generation(_BUILDERS[name](), made[name])
        return made[name]

    return trace


_BUILDERS: dict[str, Callable[[], torch.nn.Module]] = {
    "llama": ports.llama,
    "llama_rotary_offset": lambda: ports.rotary_offset(ports.llama()),
    "llama_kv_transposed": lambda: ports.kv_transposed(ports.llama()),
    "llama_mask_off_by_one": lambda: ports.mask_off_by_one(ports.llama()),
    "mistral": ports.mistral,
    "mistral_window_late": ports.sliding_window_late,
    "gpt2": ports.gpt2,
    "gpt2_position_offset": lambda: ports.gpt2_position_offset(ports.gpt2()),
}
