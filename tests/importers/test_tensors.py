"""The ``tensors`` importer: a folder of per-layer files written by a plain PyTorch script, aligned."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import tracediff
from tests.safety.helpers import cli
from tracediff import format as fmt
from tracediff.errors import DumpFormatError, OutputDirError, UsageError
from tracediff.importers import ImportResult, detect_kind, import_dump
from tracediff.importers.names import Place, compile_pattern, place_of
from tracediff.importers.tensors import ORDER_MTIME, ORDER_NAMED, ORDER_SORTED


def test_the_planted_bug_is_named_by_align(layer_dumps: tuple[Path, Path], tmp_path: Path) -> None:
    reference, port = layer_dumps
    a = import_dump("tensors", reference, out=tmp_path / "a")
    b = import_dump("tensors", port, out=tmp_path / "b")
    assert isinstance(a, ImportResult) and (a.calls, a.tensors, a.order) == (10, 10, ORDER_NAMED)
    assert b.payload_bytes == a.payload_bytes == sum(2 * 5 * w * 4 for w in [16] * 9 + [4])
    result = tracediff.align(tmp_path / "a", tmp_path / "b")
    assert not result.passed
    first = result.first_divergence
    assert first is not None and (first.module_path_b, first.tensor) == ("Model.layers.1.fc", "outputs")
    assert (result.importer_a, result.importer_b) == ("tensors", "tensors")
    assert tracediff.align(tmp_path / "a", tmp_path / "a").passed
    assert repr(a) == (f"ImportResult(kind='tensors', source='{reference}', out='{tmp_path / 'a'}', calls=10, "
                       "tensors=10)")
    assert ">calls ordered by</th><td style=\"text-align:left\">order named in the file names</td>" in a._repr_html_()
    assert a.to_dict()["payload_files"] == 10 and a.gb_per_second > 0


def test_align_takes_the_dumps_directly_and_says_so(layer_dumps: tuple[Path, Path],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    reference, port = layer_dumps
    code, out, err = cli(["align", str(reference), str(port), "--format", "json"], capsys)
    report = json.loads(out)
    assert code == 1 and report["first_divergence"]["module_path_b"] == "Model.layers.1.fc"
    assert (report["trace_a"], report["trace_b"]) == (str(reference), str(port))
    assert (report["importer_a"], report["importer_b"]) == ("tensors", "tensors")
    assert err.splitlines() == [
        f"tracediff align: {reference}: read as a dump of kind tensors (as `tracediff import tensors` would): "
        "10 calls, 10 tensors",
        f"tracediff align: {port}: read as a dump of kind tensors (as `tracediff import tensors` would): "
        "10 calls, 10 tensors"]
    assert sorted(p.name for p in reference.iterdir())[0] == "000_layers.0.fc.pt"  # nothing written there
    assert len(list(reference.iterdir())) == 10


def test_the_table_names_the_importer(layer_dumps: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(["align", str(layer_dumps[0]), str(layer_dumps[1])], capsys)
    assert code == 1
    assert out.splitlines()[:2] == [f"A: {layer_dumps[0]} (Model, imported from a dump of kind tensors)",
                                    f"B: {layer_dumps[1]} (Model, imported from a dump of kind tensors)"]


def test_show_takes_a_dump_and_names_its_importer(layer_dumps: tuple[Path, Path],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(["show", str(layer_dumps[0])], capsys)
    assert code == 0
    assert out.splitlines()[0] == (f"Model: tracediff trace imported from a dump of kind tensors at {layer_dumps[0]}; "
                                   "11 calls")


def test_nested_folders_dict_files_and_every_format(tmp_path: Path) -> None:
    src = tmp_path / "dump"
    (src / "layers" / "0" / "mlp").mkdir(parents=True)
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    torch.save({"input": x, "output": x * 2}, src / "layers" / "0" / "mlp" / "call.pt")
    np.save(src / "layers" / "0" / "output.npy", np.ones((2, 3), dtype=np.float16))
    np.savez(src / "head.npz", inputs=np.zeros(3, dtype=np.int64), outputs=np.ones(3, dtype=np.int64))
    save_file({"data": torch.ones(4, dtype=torch.bfloat16)}, str(src / "norm.safetensors"))
    torch.save(torch.zeros(2, dtype=torch.int32), src / "legacy.pth", _use_new_zipfile_serialization=False)
    (src / "README.txt").write_text("not a tensor")
    result = import_dump("tensors", src, out=tmp_path / "t")
    trace = tracediff.load_trace(tmp_path / "t")
    slots = {(n.module_path, r.slot, r.dtype) for n, r in trace.records()}
    assert slots == {("Model.layers.0.mlp.call", "inputs.args.0", "torch.float32"),
                     ("Model.layers.0.mlp.call", "outputs", "torch.float32"),
                     ("Model.layers.0", "outputs", "torch.float16"),
                     ("Model.head", "inputs.args.0", "torch.int64"), ("Model.head", "outputs", "torch.int64"),
                     ("Model.norm", "outputs", "torch.bfloat16"), ("Model.legacy", "outputs", "torch.int32")}
    node = next(n for n, r in trace.records() if n.module_path == "Model.layers.0.mlp.call")
    assert node.parent is not None and node.parent.module_path == "Model.layers.0"
    assert torch.equal(trace.load(node.tensors[1]), x * 2)
    assert result.notes[0] == "1 files that are not tensor files were left out"


def test_calls_ordered_by_modification_time_then_by_name(tmp_path: Path) -> None:
    src = tmp_path / "dump"
    src.mkdir()
    for i, name in enumerate(["zeta", "alpha", "mid"]):
        np.save(src / f"{name}.npy", np.full(2, i, dtype=np.float32))
        os.utime(src / f"{name}.npy", ns=(10**18 + i, 10**18 + i))
    by_time = import_dump("tensors", src, out=tmp_path / "t1")
    assert by_time.order == ORDER_MTIME
    assert [n.module_path for n in tracediff.load_trace(tmp_path / "t1").roots[0].children] == \
        ["Model.zeta", "Model.alpha", "Model.mid"]
    for name in ["zeta", "alpha", "mid"]:
        os.utime(src / f"{name}.npy", ns=(10**18, 10**18))
    by_name = import_dump("tensors", src, out=tmp_path / "t2")
    assert by_name.order == ORDER_SORTED and "may not be the order they ran in" in by_name.notes[0]
    assert [n.module_path for n in tracediff.load_trace(tmp_path / "t2").roots[0].children] == \
        ["Model.alpha", "Model.mid", "Model.zeta"]


@pytest.mark.parametrize(("name", "place"), [
    ("model.layers.0.mlp", Place("model.layers.0.mlp", 0, "outputs", None, None)),
    ("layers/0/mlp/output", Place("layers.0.mlp", 0, "outputs", None, None)),
    ("layers/0/mlp/input_1", Place("layers.0.mlp", 0, "inputs", 1, None)),
    ("003_layers.0.mlp.outputs.2", Place("layers.0.mlp", 0, "outputs", 2, 3)),
    ("step2/layers.0.attn", Place("layers.0.attn", 2, "outputs", None, None)),
    ("layers.0.attn@1.output", Place("layers.0.attn", 1, "outputs", None, None)),
])
def test_default_names(name: str, place: Place) -> None:
    assert place_of(name, None, "f") == place


def test_patterns() -> None:
    pattern = compile_pattern("iter{call}/{module}__{io}{index}")
    assert place_of("iter3/layers/0/mlp__input1", pattern, "f") == Place("layers.0.mlp", 3, "inputs", 1, None)
    with pytest.raises(DumpFormatError) as e:
        place_of("other", pattern, "dump/other.npy")
    assert str(e.value) == ("dump/other.npy: the name 'other' does not match --pattern "
                            "'iter{call}/{module}__{io}{index}'")
    with pytest.raises(UsageError, match=r"unknown field \{layer\}"):
        compile_pattern("{layer}.{io}")
    with pytest.raises(UsageError, match=r"has no \{module\} field"):
        compile_pattern("{order}_{io}")


def test_pattern_through_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "dump"
    (src / "s0").mkdir(parents=True)
    np.save(src / "s0" / "b-out.npy", np.ones(2, dtype=np.float32))
    np.save(src / "s0" / "a-out.npy", np.ones(2, dtype=np.float32))
    code, out, err = cli(["import", "tensors", str(src), "--out", str(tmp_path / "t"), "--pattern",
                          "s{call}/{module}-out", "--format", "json"], capsys)
    assert code == 0, err
    assert json.loads(out)["calls"] == 2
    assert json.loads((tmp_path / "t" / fmt.METADATA_FILE).read_text())["options"]["importer"]["pattern"] == \
        "s{call}/{module}-out"


def test_the_output_folder_rules(layer_dumps: tuple[Path, Path], tmp_path: Path) -> None:
    reference = layer_dumps[0]
    with pytest.raises(OutputDirError, match="inside the dump folder"):
        import_dump("tensors", reference, out=reference / "trace")
    import_dump("tensors", reference, out=tmp_path / "t")
    with pytest.raises(OutputDirError, match="is not empty; refusing to overwrite a trace"):
        import_dump("tensors", reference, out=tmp_path / "t")
    import_dump("tensors", reference, out=tmp_path / "t", overwrite=True)
    (tmp_path / "t" / "notes.txt").write_text("mine")
    with pytest.raises(OutputDirError, match=r"holds files that are not part of a trace \(notes.txt\)"):
        import_dump("tensors", reference, out=tmp_path / "t", overwrite=True)
    assert (tmp_path / "t" / "notes.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_detection(layer_dumps: tuple[Path, Path], tmp_path: Path) -> None:
    assert detect_kind(layer_dumps[0]) == "tensors"
    import_dump("tensors", layer_dumps[0], out=tmp_path / "t")
    assert detect_kind(tmp_path / "t") is None  # a trace
    (tmp_path / "empty").mkdir()
    assert detect_kind(tmp_path / "empty") is None
