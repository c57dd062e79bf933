"""The ``msprobe`` importer on real msprobe dumps (``fixtures/make_msprobe_fixtures.py``, mindstudio-probe)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import tracediff
from tests.importers.conftest import MSPROBE
from tests.safety.helpers import cli
from tracediff.errors import DumpFormatError, UnsafePathError
from tracediff.importers import detect_kind, import_dump


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("msprobe")
    for name in ("clean", "scaled_weight", "clean_statistics", "scaled_weight_statistics"):
        import_dump("msprobe", MSPROBE / name, out=root / name)
    return root


def test_the_scaled_weight_is_named(traces: Path) -> None:
    result = tracediff.align(traces / "clean", traces / "scaled_weight")
    first = result.first_divergence
    assert first is not None and not result.passed
    # the weight enters F.linear inside layers.1.fc: the op records it as its second argument
    assert (first.module_path_b, first.op, first.tensor) == ("Model.layers.1.fc", "torch.nn.functional.linear",
                                                           "inputs.args.1")
    assert all(row.within_tolerance for row in result.rows if row.order < first.order)
    assert tracediff.align(traces / "clean", traces / "clean").passed


def test_forward_backward_modules_and_apis(traces: Path) -> None:
    trace = tracediff.load_trace(traces / "clean")
    calls = [n for n in trace.nodes() if n.phase == "forward"]
    assert [n.module_path for n in calls] == [
        "Model", "Model.layers.0", "Model.layers.0.fc", "Model.layers.0.act", "Model.layers.1", "Model.layers.1.fc",
        "Model.layers.1.act", "Model.head"]
    assert [(n.module_type, n.call_index) for n in calls[1:3]] == [("Block", 0), ("Linear", 0)]
    fc = calls[2]
    assert [op.op for op in fc.ops] == ["torch.nn.functional.linear"]
    assert [op.op for op in calls[1].ops] == ["torch.Tensor.__add__"]
    assert [op.op for op in calls[0].ops] == ["torch.Tensor.sum"]  # the loss, outside any module
    backward = [(n.module_path, [r.slot for r in n.tensors]) for n in trace.backward]
    assert backward[0] == ("Model.head", ["grad_outputs.0", "grad_inputs.0"])
    assert ("Model.layers.0", ["grad_outputs.0"]) in backward  # its input needs no gradient: msprobe records none
    record = fc.tensors[-1]
    assert record.slot == "outputs" and record.payload is not None
    assert set(record.stats) == {"numel", "mean", "min", "max"}  # msprobe's Max/Min/Mean, kept


def test_statistics_only_dumps_compare_what_they_can(traces: Path) -> None:
    result = tracediff.align(traces / "clean_statistics", traces / "scaled_weight_statistics")
    first = result.first_divergence
    assert first is not None and first.approximate and first.module_path_b == "Model.layers.1.fc"
    assert all(row.approximate for row in result.rows)
    assert tracediff.align(traces / "clean", traces / "clean_statistics").passed


def test_the_result_says_what_was_left_out(tmp_path: Path) -> None:
    result = import_dump("msprobe", MSPROBE / "clean_statistics", out=tmp_path / "t")
    assert (result.calls, result.tensors, result.payload_files) == (7, 50, 0)
    assert result.notes == ("6 module parameters left out", "6 parameter gradients left out",
                            "8 API backward records left out",
                            "50 of 50 tensors have statistics only (task statistics): compared on max, min and "
                            "mean, approximately")


def test_align_reads_msprobe_dumps_directly(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(["align", str(MSPROBE / "clean"), str(MSPROBE / "scaled_weight"), "--format", "json"],
                         capsys)
    report = json.loads(out)
    assert code == 1 and report["first_divergence"]["module_path_b"] == "Model.layers.1.fc"
    assert (report["importer_a"], report["importer_b"]) == ("msprobe", "msprobe")
    assert err.splitlines()[0] == (f"tracediff align: {MSPROBE / 'clean'}: read as a dump of kind msprobe (as "
                                   "`tracediff import msprobe` would): 7 calls, 50 tensors")


def test_several_dumps_in_one_folder_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(DumpFormatError) as e:
        detect_kind(MSPROBE)
    assert str(e.value).startswith(f"{MSPROBE}: holds 4 msprobe dumps (clean/step0/rank0, ")
    code, _, err = cli(["show", str(MSPROBE)], capsys)
    assert code == 2 and err.endswith("; pass the folder of one\n")


def test_a_data_name_leading_out_of_the_dump_is_refused(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    shutil.copytree(MSPROBE / "clean", dump)
    dump_json = dump / "step0" / "rank0" / "dump.json"
    data = json.loads(dump_json.read_text())
    data["data"]["Module.head.Linear.forward.0"]["output"][0]["data_name"] = "../../../../secret.pt"
    dump_json.write_text(json.dumps(data))
    (tmp_path / "secret.pt").write_bytes(b"")
    with pytest.raises(UnsafePathError, match="links outside"):
        import_dump("msprobe", dump, out=tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_a_dump_json_that_is_not_msprobe(tmp_path: Path) -> None:
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "dump.json").write_text('{"task": "tensor"}')
    with pytest.raises(DumpFormatError) as e:
        import_dump("msprobe", tmp_path / "dump", out=tmp_path / "t")
    assert str(e.value) == f"{tmp_path / 'dump' / 'dump.json'}: not an msprobe dump.json (no 'data' object of records)"
