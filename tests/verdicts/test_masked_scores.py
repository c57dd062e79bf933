"""Masked attention scores (issue 35, contract 5): scores masked in another convention are masked on both
sides, and a softmax that reads masked scores is no error source of its own."""

from __future__ import annotations

import functools
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import tracediff
from tests.alignment import ops_models


def _older_mask_forward(self: nn.Module, hidden_states: torch.Tensor, position_embeddings: Any = None,
                        attention_mask: torch.Tensor | None = None, *, bug: str | None = None,
                        **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The op-by-op attention of ``ops_models`` with an older port's mask: -1e4 where transformers has
    ``finfo(float32).min``, so its masked scores are ``score - 1e4`` (above -1e4 for a positive score)."""
    if attention_mask is not None:
        attention_mask = attention_mask.clamp(min=-1e4)
    return ops_models.attention_forward(self, hidden_states, position_embeddings, attention_mask, bug=bug, **kwargs)


def _older_mask_port(bug: str | None) -> nn.Module:
    model = ops_models.tiny_llama("eager")
    for layer in model.layers:
        attn = layer.self_attn
        attn.forward = types.MethodType(functools.partial(_older_mask_forward, bug=bug), attn)
    return model


def _capture(model: nn.Module, folder: Path) -> Path:
    with torch.no_grad(), tracediff.capture(model, folder, ops=True):
        model(input_ids=ops_models.input_ids())
    return folder


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the same op-by-op attention with transformers' mask (finfo.min), so that the ops pair one to one
    model = ops_models.plant(ops_models.tiny_llama("eager"), [0, 1])
    return _capture(model, tmp_path_factory.mktemp("masked") / "reference")


def test_scores_masked_with_minus_1e4_against_finfo_min_are_masked_on_both_sides(reference: Path,
                                                                                 tmp_path: Path) -> None:
    result = tracediff.align(reference, _capture(_older_mask_port(None), tmp_path / "port"))
    assert result.passed, result.first_divergence
    scores = [row for row in result.rows if row.op == "torch.Tensor.add" and row.tensor == "outputs"
              and row.tensor_a.startswith("torch.Tensor.add #14")]  # scores + mask, read by the softmax
    assert len(scores) == 2  # one per layer
    # the 15 causally masked positions of each of the 4 heads: at float32's extreme in A, score - 1e4 in B
    assert all("60 masked values" in row.reason for row in scores), [row.reason for row in scores]
    assert max(row.max_abs_err for row in result.rows) < 1e-3  # no 3.4e38 anywhere


@pytest.mark.parametrize("port", ["older mask", "transformers mask"])
def test_a_softmax_reading_masked_scores_is_no_source(reference: Path, tmp_path: Path, port: str) -> None:
    model = _older_mask_port("scale") if port == "older mask" else ops_models.plant(
        ops_models.tiny_llama("eager"), [0, 1], "scale")
    result = tracediff.align(reference, _capture(model, tmp_path / "port"))
    # the wrong scale is the only source in each layer; the softmax after it only carries its error on
    # (its input's magnitude is the scores', not the 3.4e38 of their masked positions)
    assert [(row.module_path_b, row.op, row.tensor) for row in result.sources] == [
        (f"LlamaModel.layers.{i}.self_attn", "torch.Tensor.mul", "outputs") for i in (0, 1)]
    softmax = [row for row in result.rows if row.op == "torch.softmax" and row.tensor == "outputs"]
    assert len(softmax) == 2 and all(row.origin == "inherited" for row in softmax)


def _leaky_mask_forward(self: nn.Module, hidden_states: torch.Tensor, position_embeddings: Any = None,
                        attention_mask: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A real mask bug: the first query may attend to the second position (a future one)."""
    assert attention_mask is not None
    attention_mask = attention_mask.clone()
    attention_mask[..., 0, 1] = 0.0
    return ops_models.attention_forward(self, hidden_states, position_embeddings, attention_mask, **kwargs)


def test_scores_masked_on_one_side_only_are_a_mask_difference_not_a_huge_error(reference: Path,
                                                                             tmp_path: Path) -> None:
    model = ops_models.tiny_llama("eager")
    attn = model.layers[1].self_attn
    attn.forward = types.MethodType(_leaky_mask_forward, attn)
    result = tracediff.align(reference, _capture(model, tmp_path / "port"))
    first = result.first_divergence
    assert first is not None and first.module_path_b == "LlamaModel.layers.1.self_attn"
    assert first.op == "torch.Tensor.add" and "mask difference" in first.reason
    scores = next(row for row in result.rows if row.op == "torch.Tensor.add" and row.tensor == "outputs"
                  and row.module_path_b == first.module_path_b and row.tensor_a.startswith("torch.Tensor.add #14"))
    # one position of each of the 4 heads is masked in A only; the scores elsewhere are A's exactly
    assert "4 position(s) masked in A only, 0 in B only" in scores.reason
    assert scores.within_tolerance is False and scores.max_abs_err == 0.0
    assert max(row.max_abs_err for row in result.rows) < 1e3  # no 3.4e38 anywhere
