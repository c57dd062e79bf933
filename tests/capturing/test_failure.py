"""When the forward raises, or the disk fills up: the partial trace is kept and says what happened."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import tracediff
from tests.capturing.helpers import DiskFillsUp, files, find, metadata, nodes, payload, trace_json
from tests.models import CatchesInside, FailsInside, SharedLoop, seeded, toy_input


def test_forward_error_leaves_partial_trace_naming_the_module(tmp_path: Path) -> None:
    model, x = seeded(FailsInside), toy_input()
    with pytest.raises(ValueError) as raised, tracediff.capture(model, tmp_path) as session:
        model(x)
    assert raised.value is model.blocks[1].boom.raised  # the very exception, unchanged
    assert raised.value.__context__ is None and raised.value.__cause__ is None
    error = {"module_path": "FailsInside.blocks.1.boom", "call_index": 1, "type": "ValueError",
             "message": "boom at call 1: shape (2, 4)"}
    assert session.error == error and session.complete is False
    meta = metadata(tmp_path)
    assert meta["complete"] is False and meta["error"] == error and meta["capture_failure"] is None
    tree, summary = trace_json(tmp_path), trace_json(tmp_path, "SUMMARY")
    assert summary["error"] == tree["error"] == {"type": "ValueError", "message": "boom at call 1: shape (2, 4)"}
    first, second = find(tree, "FailsInside.blocks.1.boom")
    assert "error" not in first and torch.equal(payload(tmp_path, first["outputs"]), model.pre(x).detach() + 1)
    assert second["error"] == tree["error"] and "outputs" not in second
    # What ran before the failure is all there, with its data.
    assert [n["module_path"] for n in nodes(tree)] == [
        "FailsInside", "FailsInside.pre", "FailsInside.blocks.1.boom", "FailsInside.blocks.1.0",
        "FailsInside.blocks.1.boom"]
    assert second["inputs"]["args"][0]["value"] == "./FailsInside.blocks.1.0_outputs.safetensors"


def test_exception_caught_inside_the_model_leaves_a_complete_trace(tmp_path: Path) -> None:
    model, x = seeded(CatchesInside), toy_input()
    with tracediff.capture(model, tmp_path) as session:
        out = model(x)
    assert session.complete and session.error is None and metadata(tmp_path)["complete"] is True
    tree = trace_json(tmp_path)
    boom, fallback = tree["children"]
    assert boom["error"]["type"] == "ValueError" and "error" not in tree
    assert torch.equal(payload(tmp_path, fallback["outputs"]), out.detach())


def test_error_in_the_with_block_outside_the_model_propagates(tmp_path: Path) -> None:
    model = seeded(SharedLoop)
    with pytest.raises(KeyError), tracediff.capture(model, tmp_path) as session:
        model(toy_input())
        raise KeyError("after the forward")
    assert session.complete and metadata(tmp_path)["complete"] is True


def test_disk_full_names_the_file_keeps_the_partial_trace_and_lets_the_forward_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, x = seeded(SharedLoop), toy_input()
    expected = model(x)
    disk = DiskFillsUp(allowed=3)
    monkeypatch.setattr(os, "replace", disk)
    out = None
    with pytest.raises(tracediff.OutputDirError) as raised, tracediff.capture(model, tmp_path) as session:
        out = model(x)
    monkeypatch.undo()
    assert out is not None and torch.equal(out, expected)  # the user's forward completed
    refused = tmp_path / "SharedLoop.shared@1_outputs.safetensors"
    assert disk.refused == [refused.name]  # recording stopped at the first failure
    assert str(raised.value) == f"{refused}: could not write payload: No space left on device"
    assert files(tmp_path) == {
        "SharedLoop_inputs_args_0.safetensors", "SharedLoop.shared_outputs.safetensors",
        "SharedLoop.shared@1_inputs_args_0.safetensors", "SharedLoop_debug_tree_FULL_TENSORS.json",
        "SharedLoop_debug_tree_SUMMARY.json", "tracediff_metadata.json"}  # no temporary files left
    meta = metadata(tmp_path)
    assert meta["complete"] is False and meta["capture_failure"] == str(raised.value)
    assert meta["error"] is None and session.complete is False and session.files == 3
    tree = trace_json(tmp_path)
    first = find(tree, "SharedLoop.shared", 0)[0]
    assert torch.equal(payload(tmp_path, first["outputs"]), model.shared(x).detach())


def test_disk_full_for_everything_still_lets_the_forward_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, x = seeded(SharedLoop), toy_input()
    disk = DiskFillsUp(allowed=1, json_too=True)
    monkeypatch.setattr(os, "replace", disk)
    out = None
    with pytest.raises(tracediff.OutputDirError) as raised, tracediff.capture(model, tmp_path):
        out = model(x)
    monkeypatch.undo()
    assert out is not None and torch.equal(out, model(x))
    refused = tmp_path / "SharedLoop.shared_outputs.safetensors"
    assert str(raised.value) == f"{refused}: could not write payload: No space left on device"
    assert disk.refused[0] == refused.name and "tracediff_metadata.json" in disk.refused
    # no trace JSON could be written: the journal stays, so that show/align read the calls recorded (incomplete)
    assert files(tmp_path) == {"SharedLoop_inputs_args_0.safetensors", "tracediff_journal.jsonl"}
