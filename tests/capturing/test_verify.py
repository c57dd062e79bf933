"""``verify=True``: rerun without capture and compare outputs bit for bit."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff
from tests import models
from tests.capturing.helpers import metadata
from tests.models import Chain, GlobalCounter, WithDropout, WrapSensitive, seeded, toy_input
from tracediff.capturing.verify import compare_outputs


def test_identical_outputs_are_reported_identical(tiny_llama, tmp_path: Path) -> None:
    model, inputs = tiny_llama
    with tracediff.capture(model, tmp_path, verify=True) as session:
        model(**inputs)
    v = session.verification
    assert v is not None and v and v.identical and v.differences == ()
    assert v.compared == 1  # logits; past_key_values is None with use_cache=False
    assert metadata(tmp_path)["verification"] == {"identical": True, "compared": 1, "differences": []}


def test_random_model_reruns_from_the_same_rng_state(tmp_path: Path) -> None:
    model, x = seeded(WithDropout).train(), toy_input()
    torch.manual_seed(123)
    with tracediff.capture(model, tmp_path / "verified", verify=True) as session:
        model(x)
    after_verified = torch.rand(3)
    torch.manual_seed(123)
    with tracediff.capture(model, tmp_path / "plain"):
        model(x)
    assert session.verification and session.verification.compared == 1
    assert torch.equal(torch.rand(3), after_verified)  # the rerun left the RNG where the capture left it


def test_module_that_sees_the_wrapper_is_reported(tmp_path: Path) -> None:
    model, x = seeded(WrapSensitive), toy_input()
    with tracediff.capture(model, tmp_path, verify=True) as session:
        captured = model(x)
    v = session.verification
    assert v is not None and not v and not v.identical
    expected = float((captured - model(x)).abs().max().detach())
    assert v.differences == (f"outputs: values differ (max abs difference {expected:.3g})",)
    assert metadata(tmp_path)["verification"]["identical"] is False
    assert metadata(tmp_path)["complete"] is True  # the trace itself is fine


def test_global_counter_is_reported(tmp_path: Path) -> None:
    model, x = seeded(GlobalCounter), toy_input()
    models.CALL_COUNTER["n"] = 0
    with tracediff.capture(model, tmp_path, verify=True) as session:
        model(x)
    assert models.CALL_COUNTER["n"] == 2
    assert session.verification is not None
    assert session.verification.differences == ("outputs: values differ (max abs difference 1)",)


def test_run_without_capture_that_raises_is_a_difference(tmp_path: Path) -> None:
    class NeedsWrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if "forward" not in self.inner.__dict__:
                raise RuntimeError("inner is not wrapped\nsecond line")
            return self.inner(x)

    model = NeedsWrapper()
    with tracediff.capture(model, tmp_path, verify=True) as session:
        model(toy_input())
    assert session.verification is not None
    assert session.verification.differences == (
        "the run without capture raised RuntimeError: inner is not wrapped",)
    assert session.complete and metadata(tmp_path)["verification"]["identical"] is False


def test_no_verification_without_verify_or_when_forward_raises(tmp_path: Path) -> None:
    model = seeded(Chain)
    with tracediff.capture(model, tmp_path / "off") as session:
        model(toy_input())
    assert session.verification is None
    failing = seeded(models.FailsInside)
    with pytest.raises(ValueError), tracediff.capture(failing, tmp_path / "raised", verify=True) as session:
        failing(toy_input())
    assert session.verification is None and failing.blocks[1].boom.calls == 2  # no rerun


def test_compare_outputs_walks_nesting_and_compares_bits() -> None:
    a = torch.tensor([1.0, math.nan, 0.0])
    same = compare_outputs({"x": (a, 3, None)}, {"x": (a.clone(), 3, None)})
    assert same and same.compared == 3
    signed_zero = torch.tensor([1.0, math.nan, -0.0])
    assert compare_outputs(a, signed_zero).differences == (
        "outputs: bits differ, values equal (signed zeros or NaN payloads)",)
    assert compare_outputs(a, torch.tensor([1.0, 2.0, 0.0])).differences == (
        "outputs: values differ (max abs difference inf)",)
    infinite = torch.tensor([math.inf, -1.0])
    assert compare_outputs(infinite, torch.tensor([math.inf, -1.5])).differences == (
        "outputs: values differ (max abs difference 0.5)",)
    assert compare_outputs([a], [a, a]).differences == ("outputs: 1 items vs 2",)
    assert compare_outputs({"x": a}, {"y": a}).differences == ("outputs: keys ['x'] vs ['y']",)
    assert compare_outputs((a, "relu"), (a, "gelu")).differences == ("outputs.1: 'relu' vs 'gelu'",)
    assert compare_outputs(a, a.double()).differences == (
        "outputs: (3,) torch.float32 vs (3,) torch.float64",)
    assert compare_outputs(a, None).differences == ("outputs: a tensor on one side only",)
    pair = models.Pair(first=a, second=None, label="p")
    other = models.Pair(first=a + 1, second=None, label="p")
    assert compare_outputs(pair, other).differences == ("outputs.first: values differ (max abs difference 1)",)


def test_a_one_element_view_with_a_stray_stride_is_compared_by_its_bytes() -> None:
    rows = torch.arange(12.0).reshape(3, 4)
    view = rows[1:2, 1]  # one element, stride 4: contiguous, yet no flat byte view of it exists
    assert view.stride() == (4,)
    assert compare_outputs(view, torch.tensor([5.0])).identical
    assert not compare_outputs(view, torch.tensor([6.0])).identical
