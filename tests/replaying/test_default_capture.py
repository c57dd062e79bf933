"""Replay of traces captured as users capture them: ``model(input_ids=ids)``, transformers' cache on.

Every attention and decoder layer call receives a ``DynamicCache`` the trace knows only by its repr; each runs
alone with the cache B's own forward built (empty in a prefill, as A's was), so none is skipped, a clean copy
is the same math everywhere, and a planted mistake is named at its module.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import tracediff
from tests.attribution import stock


def _captured(tmp_path: Path, model: torch.nn.Module) -> Path:
    folder = tmp_path / "a"
    with tracediff.capture(model, folder):
        model(input_ids=stock.token_ids())
    return folder


@pytest.mark.parametrize("family", list(stock.FAMILIES))
def test_a_planted_mistake_in_a_default_capture_is_named_at_its_module(family: str, tmp_path: Path) -> None:
    model = stock.FAMILIES[family]()
    trace = _captured(tmp_path, model)
    port = copy.deepcopy(model)
    with torch.no_grad():  # layer 0's attention output projection, one row scaled
        port.model.layers[0].self_attn.o_proj.weight[3].mul_(1.5)
    result = tracediff.replay(port, trace)

    assert not result
    assert [c.module_path_b.split(".", 1)[1] for c in result.culprits] == ["model.layers.0.self_attn.o_proj"]
    # the later layers and their attentions (which take the cache) ran alone on A's inputs, and are the same math
    assert result.skipped == () and result.undecided == ()


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_clean_copy_of_a_default_capture_passes_with_every_call_replayed(family: str, tmp_path: Path) -> None:
    model = stock.FAMILIES[family]()
    result = tracediff.replay(copy.deepcopy(model), _captured(tmp_path, model))
    assert result and result.culprits == () and result.skipped == ()
    attention = [c for c in result.modules if c.module_type.endswith("Attention")]
    assert len(attention) == len(model.model.layers)
    # each ran alone on A's inputs, not only inside its parent's run (which hides whatever follows a culprit)
    assert not any("judged inside" in c.reason for c in result.modules)
