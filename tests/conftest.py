"""Shared fixtures: torch print options reset around every test, and the tiny models of ``tests/models.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests import models


@pytest.fixture(autouse=True)
def _default_print_options() -> Iterator[None]:
    """transformers' debugger turns ``sci_mode`` on globally and never restores it; start and end at defaults."""
    torch.set_printoptions(profile="default")
    yield
    torch.set_printoptions(profile="default")


@pytest.fixture
def tiny_llama() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    return models.tiny_llama()


@pytest.fixture
def tiny_gpt2() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    return models.tiny_gpt2()


@pytest.fixture
def tiny_bert() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    return models.tiny_bert()
