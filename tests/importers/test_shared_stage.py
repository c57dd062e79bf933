"""Captures and imports write their traces through one stage (``tracediff/files/trace_writing.py``).

The same tensor, captured as a module's output and imported from a ``.npy`` file, gets the same entry
(shape, dtype, device, payload name and bytes); both finish their trace with the stage's ``write_tree`` and
``write_metadata``; an import's metadata names the engine when the dump says.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tracediff
from tests.importers.conftest import ROOT
from tracediff.files import trace_writing
from tracediff.files.payloads import read_tensor_file
from tracediff.importers import import_dump

POLYGRAPHY_CLEAN = ROOT / "fixtures" / "polygraphy" / "clean" / "onnxrt_outputs.json"


class Proj(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


@pytest.fixture
def finished(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The folders whose trees and metadata the stage wrote, in order."""
    seen: list[str] = []
    write_tree, write_metadata = trace_writing.TraceStage.write_tree, trace_writing.TraceStage.write_metadata

    def tree(self: trace_writing.TraceStage, *args: Any, **kwargs: Any) -> None:
        seen.append(f"tree {self.folder.name}")
        write_tree(self, *args, **kwargs)

    def metadata(self: trace_writing.TraceStage, *args: Any, **kwargs: Any) -> None:
        seen.append(f"metadata {self.folder.name}")
        write_metadata(self, *args, **kwargs)

    monkeypatch.setattr(trace_writing.TraceStage, "write_tree", tree)
    monkeypatch.setattr(trace_writing.TraceStage, "write_metadata", metadata)
    yield seen


def test_a_captured_and_an_imported_tensor_get_the_same_entry(tmp_path: Path, finished: list[str]) -> None:
    model = Proj()
    with torch.no_grad(), tracediff.capture(model, tmp_path / "captured"):
        out = model(torch.ones(4, 3))
    dump = tmp_path / "dump"
    dump.mkdir()
    np.save(dump / "proj.npy", out.numpy())  # the same tensor, as another tool's dump
    import_dump("tensors", dump, out=tmp_path / "imported")
    assert [line.split()[0] for line in finished] == ["tree", "metadata", "tree", "metadata"]
    assert finished[0].endswith("captured") and finished[2].endswith(".importing")  # renamed into place after

    captured = json.loads((tmp_path / "captured" / "Proj_debug_tree_FULL_TENSORS.json").read_text())
    imported = json.loads((tmp_path / "imported" / "Model_debug_tree_FULL_TENSORS.json").read_text())
    a, b = captured["children"][0]["outputs"], imported["children"][0]["outputs"]
    assert (a["shape"], a["dtype"], a["device"], a["stats"]["numel"]) == \
        (b["shape"], b["dtype"], b["device"], b["stats"]["numel"]) == ("torch.Size([4, 2])", "torch.float32", "cpu", 8)
    assert a["value"] == "./Proj.proj_outputs.safetensors" and b["value"] == "./Model.proj_outputs.safetensors"
    assert torch.equal(read_tensor_file(tmp_path / "captured" / a["value"][2:]),
                       read_tensor_file(tmp_path / "imported" / b["value"][2:]))
    for folder in ("captured", "imported"):  # metadata from the same builder: version, dtypes, devices, counts
        meta = json.loads((tmp_path / folder / "tracediff_metadata.json").read_text())
        assert (meta["dtypes"], meta["devices"]) == (["torch.float32"], ["cpu"]) and meta["payload_files"] >= 1
        assert meta["tracediff_version"] == tracediff.__version__
    assert json.loads((tmp_path / "captured" / "tracediff_metadata.json").read_text())["framework"] == "torch"
    assert "framework" not in json.loads((tmp_path / "imported" / "tracediff_metadata.json").read_text())


def test_a_polygraphy_import_names_its_engine(tmp_path: Path) -> None:
    import_dump("polygraphy", POLYGRAPHY_CLEAN, out=tmp_path / "t")
    meta = json.loads((tmp_path / "t" / "tracediff_metadata.json").read_text())
    assert (meta["framework"], meta["framework_version"]) == ("onnxruntime", None)


def test_two_names_that_sanitize_alike_get_two_files(tmp_path: Path) -> None:
    stage = trace_writing.TraceStage(tmp_path)
    assert [stage.payload_file(name) for name in ("a/b", "a_b", "a:b", "a_b")] == [
        "a_b.safetensors", "a_b~1.safetensors", "a_b~2.safetensors", "a_b~3.safetensors"]
