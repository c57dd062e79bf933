"""Reference traces for the replay tests, captured once per module."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff


def capture_once(factory: pytest.TempPathFactory, name: str, model: nn.Module, *args: object,
                 **kwargs: object) -> Path:
    folder = factory.mktemp(name)
    with torch.no_grad(), tracediff.capture(model, folder, overwrite=True):
        model(*args, **kwargs)
    return folder


@pytest.fixture(scope="session")
def capture_ref(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    cache: dict[str, Path] = {}

    def get(name: str, build: Callable[[], nn.Module], *args: object, **kwargs: object) -> Path:
        if name not in cache:
            cache[name] = capture_once(tmp_path_factory, name, build(), *args, **kwargs)
        return cache[name]

    return get


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> object:
    """Tiny models run faster on one thread, and the suite shares the machine's cores; restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
