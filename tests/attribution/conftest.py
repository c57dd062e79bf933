"""Float references captured once per module, and their quantized copies."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch import nn

import tracediff

from . import models


def captured(tmp: Path, model: nn.Module, inputs: dict[str, Any]) -> Path:
    folder = tmp / "float"
    with tracediff.capture(model, folder):
        model(**inputs)
    return folder


def quantized(model: nn.Module, quantize: Callable[[nn.Module, str], None], path: str) -> nn.Module:
    copy_ = copy.deepcopy(model)
    quantize(copy_, path)
    return copy_


@pytest.fixture(scope="module")
def torchao_or_skip() -> Callable[[str], Callable[[nn.Module, str], None]]:
    pytest.importorskip("torchao", reason="the ports extra installs torchao")
    return models.torchao
