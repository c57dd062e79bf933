"""SPECs for ``tracediff attribute`` in the command-line tests: quantized copies of ``models.llama(layers=3)``."""

from __future__ import annotations

from typing import Any

from torch import nn

from . import models


def float_llama() -> tuple[nn.Module, dict[str, Any]]:
    return models.llama(layers=3), {"input_ids": models.token_ids()}


def int4_llama() -> tuple[nn.Module, dict[str, Any]]:
    model, inputs = float_llama()
    models.torchao("int4wo")(model, "model.layers")
    return model, inputs


def qint8_llama() -> nn.Module:
    model, _ = float_llama()
    models.quanto("qint8")(model, "model.layers")
    return model


def stock_llama() -> tuple[nn.Module, dict[str, Any]]:
    """The float model at transformers' defaults (sdpa, the cache on), for captures as users make them."""
    from . import stock

    return stock.llama(), {"input_ids": stock.token_ids()}


def stock_llama_bf16() -> nn.Module:
    return stock_llama()[0].bfloat16()
