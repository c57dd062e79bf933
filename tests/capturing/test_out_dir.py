"""The output folder is checked before the forward runs, and an earlier trace is never overwritten silently."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff
from tests.capturing.helpers import files, trace_json
from tests.models import Chain, SharedLoop, seeded, toy_input


class CountsForwards(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x


def _refused(out_dir: Path, message: str, **options: object) -> None:
    model = CountsForwards()
    with pytest.raises(tracediff.OutputDirError) as raised:
        with tracediff.capture(model, out_dir, **options):  # type: ignore[arg-type]
            model(toy_input())
    assert str(raised.value) == message
    assert model.calls == 0 and "forward" not in model.__dict__


def test_non_empty_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    _refused(tmp_path, f"{tmp_path}: is not empty; refusing to overwrite a trace (use --overwrite)")
    assert files(tmp_path) == {"notes.txt"}


def test_a_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "trace"
    target.write_text("not a folder")
    _refused(target, f"{target}: is a file, not a directory")
    _refused(target, f"{target}: is a file, not a directory", overwrite=True)
    assert target.read_text() == "not a folder"


def test_a_path_under_a_regular_file_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    target = blocker / "sub" / "trace"
    _refused(target, f"{target}: cannot write here ({blocker} is not a writable directory)")


def test_an_unwritable_location_is_refused() -> None:
    target = Path("/proc/tracediff-capture-test/trace")
    _refused(target, f"{target}: cannot write here (No such file or directory)")


def test_missing_folders_are_created(tmp_path: Path) -> None:
    model = seeded(Chain)
    with tracediff.capture(model, tmp_path / "a" / "b") as session:
        model(toy_input())
    assert session.trace_dir == tmp_path / "a" / "b" and session.complete


def test_overwrite_replaces_an_earlier_trace_and_keeps_other_files(tmp_path: Path) -> None:
    model = seeded(SharedLoop)
    with tracediff.capture(model, tmp_path):
        model(toy_input())
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "rank1").mkdir()
    (tmp_path / "rank1" / "tracediff_metadata.json").write_text("{}")
    other = seeded(Chain)
    with tracediff.capture(other, tmp_path, overwrite=True) as session:
        other(toy_input())
    assert session.complete
    assert files(tmp_path) == {
        "notes.txt", "Chain_inputs_args_0.safetensors", "Chain.a_outputs.safetensors", "Chain.b_outputs.safetensors",
        "Chain_debug_tree_FULL_TENSORS.json", "Chain_debug_tree_SUMMARY.json", "tracediff_metadata.json"}
    assert trace_json(tmp_path)["module_path"] == "Chain"
