"""The ``polygraphy`` importer on real Polygraphy output (``fixtures/make_polygraphy_fixtures.py``: ONNX Runtime)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest

import tracediff
from tests.importers.conftest import ROOT
from tests.safety.helpers import cli
from tracediff.importers import detect_kind, import_dump

FIXTURES = ROOT / "fixtures" / "polygraphy"
CLEAN, BUG = FIXTURES / "clean" / "onnxrt_outputs.json", FIXTURES / "scaled_weight" / "onnxrt_outputs.json"


def test_the_scaled_weight_is_named(tmp_path: Path) -> None:
    a = import_dump("polygraphy", CLEAN, out=tmp_path / "a")
    import_dump("polygraphy", BUG.parent, out=tmp_path / "b")  # the folder holding the JSON works too
    assert (a.calls, a.tensors) == (12, 14) and a.notes[0].startswith("the outputs of onnxrt-runner-N0-")
    result = tracediff.align(tmp_path / "a", tmp_path / "b")
    first = result.first_divergence
    assert first is not None and (first.module_path_b, first.op, first.tensor) == ("Model.layers.1.fc",
                                                                                   "onnx.MatMul", "outputs")
    assert tracediff.align(tmp_path / "a", tmp_path / "a").passed


def test_scopes_become_nested_calls_and_nodes_ops(tmp_path: Path) -> None:
    import_dump("polygraphy", CLEAN, out=tmp_path / "t")
    trace = tracediff.load_trace(tmp_path / "t")
    calls = [n.module_path for n in trace.nodes()]
    assert calls[:5] == ["Model", "Model.layers", "Model.layers.0", "Model.layers.0.fc", "Model.layers.0.act"]
    fc = next(n for n in trace.nodes() if n.module_path == "Model.layers.0.fc")
    assert [(op.op, op.op_index) for op in fc.ops] == [("onnx.MatMul", 0), ("onnx.Add", 1)]
    assert fc.parent is not None and fc.parent.module_path == "Model.layers.0"
    assert [r.slot for r in trace.roots[0].tensors] == ["outputs"]  # the graph output, named 26 by the exporter


def test_align_takes_the_json_files_directly(capsys: pytest.CaptureFixture[str]) -> None:
    assert detect_kind(CLEAN) == detect_kind(CLEAN.parent) == "polygraphy"
    code, out, err = cli(["align", str(CLEAN), str(BUG), "--format", "json"], capsys)
    report = json.loads(out)
    assert code == 1 and report["first_divergence"]["module_path_b"] == "Model.layers.1.fc"
    assert (report["importer_a"], report["importer_b"], report["trace_a"]) == ("polygraphy", "polygraphy", str(CLEAN))
    assert err.splitlines()[0] == (f"tracediff align: {CLEAN}: read as a dump of kind polygraphy (as `tracediff "
                                   "import polygraphy` would): 12 calls, 14 tensors")


def _results(outputs: dict[str, object], runners: int = 1) -> dict[str, object]:
    iteration = {"outputs": outputs, "runner_name": "r", "polygraphy_class": "IterationResult"}
    return {"lst": [[f"runner{i}", [iteration]] for i in range(runners)], "polygraphy_class": "RunResults"}


def _encoded(array: np.ndarray) -> dict[str, object]:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return {"values": {"array": base64.b64encode(buffer.getvalue()).decode(), "polygraphy_class": "ndarray"},
            "polygraphy_class": "LazyArray"}


@pytest.mark.parametrize(("results", "message"), [
    (_results({"/a/MatMul_output_0": {"values": {"array": "not base64!", "polygraphy_class": "ndarray"},
                                      "polygraphy_class": "LazyArray"}}),
     "output '/a/MatMul_output_0' cannot be decoded (Only base64 data is allowed)"),
    (_results({"/a/MatMul_output_0": _encoded(np.array([{"code": 1}], dtype=object))}),
     "output '/a/MatMul_output_0' cannot be decoded (Object arrays cannot be loaded when allow_pickle=False)"),
    (_results({"/a/Relu_output_0": _encoded(np.ones(2, dtype=np.float32))}, runners=2),
     "holds the results of 2 runners (runner0, runner1); save one runner's outputs per file"),
])
def test_malformed_results_are_refused(results: dict[str, object], message: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(results))
    code, out, err = cli(["import", "polygraphy", str(path), "--out", str(tmp_path / "t")], capsys)
    assert (code, out, err) == (2, "", f"tracediff import: error: {path}: {message}\n")
    assert not (tmp_path / "t").exists()
