"""Untrusted model files: every mutation of a genuine ONNX model (with external data), OpenVINO IR and ExecuTorch
program is captured from the command line, and keeps the capture's promises.

Each runtime starts from a genuine model folder made here (a few nodes, fixed seeds) and its inputs file. Every
mutation in ``*_MUTATIONS`` copies the folder, changes one thing — the model file truncated at six points or
with bytes flipped at eight, replaced by a directory, a FIFO, a link loop, a link out of the folder or to
``/dev/zero``; an ONNX tensor's external data ``location`` rewritten (``..``, an absolute path, NUL, 5,000
characters, the folder itself) or its data file linked elsewhere, cut short, removed; an IR's ``.bin`` linked,
cut short, removed, its XML given an entity declaration; a program's ETRecord cut short or replaced by
garbage — and runs ``tracediff capture FILE --inputs F --out D``. Asserted: exit 0 or 2, never a traceback,
one line on stderr for exit 2, at most 20 s; and **exit 2 for every mutation that points outside the folder**,
whose target is a FIFO outside it: a read of it would block, so "nothing read outside" is checked by the time
limit, not by trust.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.safety.helpers import cli
from tests.safety.test_fuzz import RUN_SECONDS, time_limit

Mutation = Callable[[Path, Path], None]  # (the copied model folder, the folder around it) -> None
OUTSIDE = "outside.fifo"  # beside the model's folder: opened by nothing, or the run blocks


def _truncate(name: str, fraction: float) -> Mutation:
    def mutate(folder: Path, _: Path) -> None:
        path = folder / name
        data = path.read_bytes()
        keep = len(data) - 1 if fraction >= 1 else int(len(data) * fraction)
        path.write_bytes(data[:keep])
    return mutate


def _flip(name: str, where: float) -> Mutation:
    def mutate(folder: Path, _: Path) -> None:
        path = folder / name
        data = bytearray(path.read_bytes())
        index = min(len(data) - 1, int(len(data) * where))
        data[index] ^= 0xFF
        path.write_bytes(bytes(data))
    return mutate


def _replace(name: str, by: str) -> Mutation:
    def mutate(folder: Path, around: Path) -> None:
        path = folder / name
        path.unlink()
        if by == "directory":
            path.mkdir()
        elif by == "fifo":
            os.mkfifo(path)
        elif by == "loop":
            path.symlink_to(path.name)
        elif by == "outside":
            path.symlink_to(around / OUTSIDE)
        elif by == "zero":
            path.symlink_to("/dev/zero")
        elif by == "inside-link":  # a link to a copy inside the folder: refused as a link
            shutil.copy(folder / f"{name}.copy", folder / f"{name}.real")
            path.symlink_to(f"{name}.real")
        elif by != "missing":
            raise AssertionError(by)
    return mutate


def _file_mutations(name: str) -> list[tuple[str, Mutation, bool]]:
    """(id, mutation, must be refused) for one file of a model."""
    out: list[tuple[str, Mutation, bool]] = []
    out += [(f"{name}-truncated-{f}", _truncate(name, f), f == 0) for f in (0, 0.001, 0.1, 0.5, 0.9, 1)]
    out += [(f"{name}-flipped-{w}", _flip(name, w), False) for w in (0, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.999)]
    out += [(f"{name}-{by}", _replace(name, by), True) for by in ("directory", "fifo", "loop", "outside", "zero",
                                                                   "missing")]
    return out


def _run(argv: list[str], capsys: Any) -> tuple[int, str]:
    with time_limit(RUN_SECONDS):
        code, _, err = cli(argv, capsys)
    assert "Traceback" not in err, err
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("tracediff capture: error: "), err
    return code, err


def _case(genuine: Path, tmp_path: Path, mutate: Mutation, model: str, extra: list[str], capsys: Any,
          refused: bool) -> None:
    around = tmp_path / "around"
    folder = shutil.copytree(genuine, around / "model", symlinks=True)
    os.mkfifo(around / OUTSIDE)
    mutate(folder, around)
    code, err = _run(["capture", str(folder / model), "--inputs", str(genuine / "inputs.safetensors"),
                      "--out", str(around / "trace"), *extra], capsys)
    if refused:
        assert code == 2, err


# --- ONNX Runtime ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def onnx_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "weight")
    bias = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "bias")
    nodes = [helper.make_node("MatMul", ["x", "weight"], ["h"], name="/model/layers.0/fc/MatMul"),
             helper.make_node("Add", ["h", "bias"], ["y"], name="/model/layers.0/fc/Add"),
             helper.make_node("Relu", ["y"], ["out"], name="/model/layers.0/act/Relu")]
    graph = helper.make_graph(nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 16])],
                              initializer=[weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    folder = tmp_path_factory.mktemp("onnx")
    onnx.save_model(model, folder / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    shutil.copy(folder / "model.onnx", folder / "model.onnx.copy")
    shutil.copy(folder / "model.onnx.data", folder / "model.onnx.data.copy")
    save_file({"x": torch.randn(2, 16, generator=torch.Generator().manual_seed(1))}, str(folder / "inputs.safetensors"))
    return folder


def _location(location: str) -> Mutation:
    def mutate(folder: Path, around: Path) -> None:
        import onnx

        model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
        text = location.replace("{outside}", str(around / OUTSIDE)).replace("{data}", str(folder / "model.onnx.data"))
        for tensor in model.graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = text
        onnx.save_model(model, folder / "model.onnx")
    return mutate


ONNX_MUTATIONS: list[tuple[str, Mutation, bool]] = [
    *_file_mutations("model.onnx"),
    *[(f"model.onnx.data-{by}", _replace("model.onnx.data", by), True)
      for by in ("directory", "fifo", "loop", "outside", "zero", "missing", "inside-link")],
    ("model.onnx.data-truncated", _truncate("model.onnx.data", 0.5), True),
    *[(f"location-{i}", _location(text), True) for i, text in enumerate(
        ["../outside.fifo", "{outside}", "{data}", "sub/../../outside.fifo", "a\0b", ".", "x" * 5000,
         "/dev/zero"])],
]


@pytest.mark.parametrize(("mutation", "refused"), [(m, r) for _, m, r in ONNX_MUTATIONS],
                         ids=[name for name, _, _ in ONNX_MUTATIONS])
def test_a_mutated_onnx_model_keeps_every_promise(onnx_folder: Path, tmp_path: Path, mutation: Mutation,
                                                  refused: bool, capsys: Any) -> None:
    _case(onnx_folder, tmp_path, mutation, "model.onnx", [], capsys, refused)


def test_the_genuine_onnx_model_is_captured(onnx_folder: Path, tmp_path: Path, capsys: Any) -> None:
    code, err = _run(["capture", str(onnx_folder / "model.onnx"), "--inputs",
                      str(onnx_folder / "inputs.safetensors"), "--out", str(tmp_path / "trace")], capsys)
    assert code == 0, err


# --- OpenVINO -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openvino_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ov = pytest.importorskip("openvino", reason="the openvino extra is not installed")
    import openvino.opset13 as ops

    rng = np.random.default_rng(0)
    x = ops.parameter([2, 16], np.float32, name="x")
    h = ops.matmul(x, ops.constant(rng.standard_normal((16, 16)).astype(np.float32)), False, False)
    h.set_friendly_name("__module.model.layers.0.fc/aten::linear/MatMul")
    out = ops.relu(h)
    out.set_friendly_name("__module.model.layers.0.act/aten::relu/Relu")
    model = ov.Model([out], [x], "fuzz")
    folder = tmp_path_factory.mktemp("openvino")
    ov.save_model(model, str(folder / "model.xml"), compress_to_fp16=False)
    shutil.copy(folder / "model.xml", folder / "model.xml.copy")
    shutil.copy(folder / "model.bin", folder / "model.bin.copy")
    save_file({"x": torch.randn(2, 16, generator=torch.Generator().manual_seed(1))}, str(folder / "inputs.safetensors"))
    return folder


def _entity(folder: Path, _: Path) -> None:
    path = folder / "model.xml"
    text = path.read_text()
    bomb = '<!DOCTYPE net [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>\n'
    path.write_text(text.replace("?>\n", "?>\n" + bomb, 1) if text.startswith("<?xml") else bomb + text)


OPENVINO_MUTATIONS: list[tuple[str, Mutation, bool]] = [
    *_file_mutations("model.xml"),
    *[(f"model.bin-{by}", _replace("model.bin", by), True)
      for by in ("directory", "fifo", "loop", "outside", "zero", "missing", "inside-link")],
    ("model.bin-truncated", _truncate("model.bin", 0.5), False),
    ("model.xml-entity", _entity, True),
    ("model.xml-inside-link", _replace("model.xml", "inside-link"), True),
]


@pytest.mark.parametrize(("mutation", "refused"), [(m, r) for _, m, r in OPENVINO_MUTATIONS],
                         ids=[name for name, _, _ in OPENVINO_MUTATIONS])
def test_a_mutated_openvino_ir_keeps_every_promise(openvino_folder: Path, tmp_path: Path, mutation: Mutation,
                                                   refused: bool, capsys: Any) -> None:
    _case(openvino_folder, tmp_path, mutation, "model.xml", [], capsys, refused)


def test_the_genuine_openvino_ir_is_captured(openvino_folder: Path, tmp_path: Path, capsys: Any) -> None:
    code, err = _run(["capture", str(openvino_folder / "model.xml"), "--inputs",
                      str(openvino_folder / "inputs.safetensors"), "--out", str(tmp_path / "trace")], capsys)
    assert code == 0, err


# --- ExecuTorch -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def executorch_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("executorch", reason="executorch is not installed")
    from tests.capturing.test_executorch import Exported

    folder = tmp_path_factory.mktemp("executorch")
    exported = Exported(folder)
    (folder / "tiny.pte").rename(folder / "model.pte")
    exported.inputs_file(folder)
    for name in ("model.pte", "etrecord.bin"):
        shutil.copy(folder / name, folder / f"{name}.copy")
    return folder


def _garbage(name: str) -> Mutation:
    def mutate(folder: Path, _: Path) -> None:
        (folder / name).write_bytes(b"\x00garbage" * 64)
    return mutate


EXECUTORCH_MUTATIONS: list[tuple[str, Mutation, bool]] = [
    *_file_mutations("model.pte"),
    ("model.pte-inside-link", _replace("model.pte", "inside-link"), True),
    *[(f"etrecord.bin-truncated-{f}", _truncate("etrecord.bin", f), True) for f in (0, 0.1, 0.5, 0.9, 1)],
    *[(f"etrecord.bin-flipped-{w}", _flip("etrecord.bin", w), False) for w in (0, 0.3, 0.6, 0.999)],
    ("etrecord.bin-garbage", _garbage("etrecord.bin"), True),
    *[(f"etrecord.bin-{by}", _replace("etrecord.bin", by), True)
      for by in ("directory", "fifo", "loop", "outside", "zero", "missing")],
]


@pytest.mark.parametrize(("mutation", "refused"), [(m, r) for _, m, r in EXECUTORCH_MUTATIONS],
                         ids=[name for name, _, _ in EXECUTORCH_MUTATIONS])
def test_a_mutated_executorch_program_keeps_every_promise(executorch_folder: Path, tmp_path: Path,
                                                          mutation: Mutation, refused: bool, capsys: Any) -> None:
    around = tmp_path / "around"
    _case(executorch_folder, tmp_path, mutation, "model.pte",
          ["--etrecord", str(around / "model" / "etrecord.bin")], capsys, refused)


def test_the_genuine_executorch_program_is_captured(executorch_folder: Path, tmp_path: Path, capsys: Any) -> None:
    folder = executorch_folder
    code, err = _run(["capture", str(folder / "model.pte"), "--etrecord", str(folder / "etrecord.bin"), "--inputs",
                      str(folder / "inputs.safetensors"), "--out", str(tmp_path / "trace")], capsys)
    assert code == 0, err
