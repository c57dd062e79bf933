"""The ONNX Runtime adapter (``tracediff/capturing/adapters/onnxruntime.py``): an ONNX graph run by ONNX Runtime,
every node's output recorded with its module scopes, op and dataflow; its inputs fed by name; untrusted files
refused before anything outside the model's folder is read.

``tiny_model()`` is a hand-made graph of five nodes with each way a node can say where it came from: torch's
dynamo name scopes (metadata), the legacy exporter's ``/model/...`` node names, and nothing (an anonymous node).
Its values are computed here with numpy and compared with the recorded payloads.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.capturing.helpers import metadata, nodes, trace_json
from tracediff import format as fmt
from tracediff.files.payloads import read_tensor_file

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tracediff.capturing.adapters.onnx_nodes import parse_name_scopes, scope_of, short_name  # noqa: E402
from tracediff.cli.main import main  # noqa: E402

RNG = np.random.default_rng(0)
EMBED = RNG.standard_normal((10, 4)).astype(np.float32)
BIAS = RNG.standard_normal(2).astype(np.float32)
IDS = np.array([[1, 2, 7]], dtype=np.int64)


def _scoped(node: Any, scopes: list[str]) -> Any:
    entry = node.metadata_props.add()
    entry.key, entry.value = "pkg.torch.onnx.name_scopes", repr(scopes)
    return node


def tiny_model(*, ids_type: int = TensorProto.INT32) -> Any:
    """ids -> Gather(embed) -> Pow(2, a Constant) -> Split in two -> Mul -> Add(bias) -> out."""
    graph_nodes = [
        _scoped(helper.make_node("Gather", ["embed", "ids"], ["emb"], name="node_embedding"),
                ["", "model", "model.embed_tokens", "embedding"]),
        helper.make_node("Constant", [], ["two"], name="node_two", value=numpy_helper.from_array(np.float32(2.0))),
        _scoped(helper.make_node("Pow", ["emb", "two"], ["pow"], name="node_pow_1"),
                ["", "model", "model.layers.0", "model.layers.0.norm", "pow_1"]),
        _scoped(helper.make_node("Split", ["pow", "halves"], ["left", "right"], name="node_split", axis=-1),
                ["", "model", "model.layers.0", "split_3"]),
        helper.make_node("Mul", ["left", "right"], ["prod"], name="/model/layers.0/mlp/Mul_1"),
        helper.make_node("Add", ["prod", "bias"], ["out"], name="n7"),
    ]
    graph = helper.make_graph(
        graph_nodes, "tiny", [helper.make_tensor_value_info("ids", ids_type, [1, "seq"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(EMBED, "embed"), numpy_helper.from_array(BIAS, "bias"),
                     numpy_helper.from_array(np.array([2, 2], dtype=np.int64), "halves")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="handmade",
                             producer_version="1.0", ir_version=10)


def expected(ids: np.ndarray = IDS) -> dict[str, np.ndarray]:
    emb = EMBED[ids]
    power = emb ** np.float32(2.0)
    left, right = power[..., :2], power[..., 2:]
    return {"emb": emb, "pow": power, "left": left, "right": right, "prod": left * right,
            "out": left * right + BIAS}


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import tracediff

    out = tmp_path_factory.mktemp("onnx") / "t"
    session = tracediff.capture_file(tiny_model(), out, inputs={"kwargs.ids": torch.from_numpy(IDS)})
    assert session.complete
    return out


def _recorded(folder: Path) -> list[dict[str, Any]]:
    return [n for n in nodes(trace_json(folder)) if n.get(fmt.MODULE_TYPE) not in (None, "ONNXModel")
            and fmt.STEP not in n]


def test_every_node_output_is_recorded_with_its_scopes_op_and_sources(captured: Path) -> None:
    recorded = _recorded(captured)
    assert [(n[fmt.MODULE_PATH], n[fmt.MODULE_TYPE], n.get(fmt.NODE_SCOPES)) for n in recorded] == [
        ("ONNXModel.model.embed_tokens.embedding", "Gather", ["model", "model.embed_tokens"]),
        ("ONNXModel.model.layers.0.norm.pow", "Pow", ["model", "model.layers.0", "model.layers.0.norm"]),
        ("ONNXModel.model.layers.0.split_output_0", "Split", ["model", "model.layers.0"]),
        ("ONNXModel.model.layers.0.split_output_1", "Split", ["model", "model.layers.0"]),
        ("ONNXModel.model.layers.0.mlp.Mul", "Mul", ["model", "model.layers.0", "model.layers.0.mlp"]),
        ("ONNXModel.Add", "Add", None),  # no metadata, an anonymous name: no scope, named by its op
    ]  # the Constant is not recorded: its value, as the initializers', comes from outside the trace
    values = expected()
    for node, key in zip(recorded, ["emb", "pow", "left", "right", "prod", "out"]):
        payload = read_tensor_file(captured / node[fmt.OUTPUTS][fmt.VALUE].removeprefix("./"))
        assert torch.allclose(payload, torch.from_numpy(values[key]), rtol=1e-6, atol=0), key
    assert recorded[0][fmt.SOURCES] == [{"external": "embed"}, {"external": "ids"}]
    assert recorded[1][fmt.SOURCES] == [{"module_path": "ONNXModel.model.embed_tokens.embedding", "call_index": 0},
                                        {"external": "two"}]
    split = {"module_path": "ONNXModel.model.layers.0.norm.pow", "call_index": 0}
    assert recorded[2][fmt.SOURCES] == [split, {"external": "halves"}]
    assert recorded[4][fmt.SOURCES] == [{"module_path": "ONNXModel.model.layers.0.split_output_0", "call_index": 0},
                                        {"module_path": "ONNXModel.model.layers.0.split_output_1", "call_index": 0}]
    assert recorded[2][fmt.ATTRIBUTES] == {"onnx_node": "node_split", "axis": -1, "output_index": 0}


def test_the_metadata_names_the_runtime_its_level_and_the_exporter(captured: Path) -> None:
    found = metadata(captured)
    assert (found[fmt.FRAMEWORK], found[fmt.FRAMEWORK_VERSION]) == ("onnxruntime", ort.__version__)
    runtime = found[fmt.RUNTIME]
    assert runtime["provider"] == "CPUExecutionProvider"
    assert runtime["graph_optimization"] == "all"  # ONNX Runtime's default, none given
    assert (runtime["exporter"], runtime["opset"]) == ("handmade 1.0", {"ai.onnx": 17})
    assert runtime["inputs_cast"] == {"ids": "int64 -> int32"}  # the ids fed as the graph declares them
    assert runtime["scopes_from"] == {"name_scopes": 3, "node_name": 1, "none": 1}
    # the graph also run as exported, no value marked: its output is the marked run's, bit for bit
    assert runtime["unmarked_max_abs_difference"] == {"out": 0.0}
    assert found["graph"]["scopes"] == "modules" and "Reshape" in found["graph"]["views"]


@pytest.mark.parametrize("level", ["disable", "basic", "extended", "all"])
def test_every_optimization_level_records_the_same_values(tmp_path: Path, level: str) -> None:
    import tracediff

    tracediff.capture_file(tiny_model(), tmp_path / "t", inputs={"ids": IDS}, options={"graph_optimization": level})
    assert metadata(tmp_path / "t")[fmt.RUNTIME]["graph_optimization"] == level
    (out,) = [n for n in _recorded(tmp_path / "t") if n[fmt.MODULE_TYPE] == "Add"]
    payload = read_tensor_file(tmp_path / "t" / out[fmt.OUTPUTS][fmt.VALUE].removeprefix("./"))
    assert torch.allclose(payload, torch.from_numpy(expected()["out"]), rtol=1e-6, atol=0)


def test_inputs_are_found_by_name_or_position(tmp_path: Path) -> None:
    import tracediff

    for k, inputs in enumerate(({"ids": IDS}, {"args.0": torch.from_numpy(IDS)})):
        session = tracediff.capture_file(tiny_model(ids_type=TensorProto.INT64), tmp_path / str(k), inputs=inputs)
        assert session.complete
        assert metadata(tmp_path / str(k))[fmt.RUNTIME]["inputs_cast"] == {}


def _inputs_file(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path = tmp_path / "inputs.safetensors"
    save_file(tensors, str(path))
    return path


def _model_file(tmp_path: Path, model: Any | None = None) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(model if model is not None else tiny_model(), str(path))
    return path


def test_the_command_line_captures_a_model_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = _inputs_file(tmp_path, {"kwargs.ids": torch.from_numpy(IDS)})
    code = main(["capture", str(_model_file(tmp_path)), "--inputs", str(inputs), "--out", str(tmp_path / "o"),
                 "--graph-optimization", "basic"])
    assert code == 0, capsys.readouterr().err
    assert metadata(tmp_path / "o")[fmt.RUNTIME]["graph_optimization"] == "basic"


def test_a_graph_input_missing_from_the_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = _inputs_file(tmp_path, {"kwargs.input_ids": torch.from_numpy(IDS)})
    code = main(["capture", str(_model_file(tmp_path)), "--inputs", str(inputs), "--out", str(tmp_path / "o")])
    assert code == 2
    assert capsys.readouterr().err == (f"tracediff capture: error: {inputs}: graph input 'ids' is not in the file "
                                       "(it holds kwargs.input_ids)\n")
    assert not (tmp_path / "o").exists()


def test_float_values_for_integer_ids_are_refused(tmp_path: Path) -> None:
    import tracediff
    from tracediff.errors import UsageError

    with pytest.raises(UsageError, match=r"^inputs: kwargs.ids: float32 values for graph input 'ids', which "
                                         r"takes int32$"):
        tracediff.capture_file(tiny_model(), tmp_path / "o", inputs={"kwargs.ids": IDS.astype(np.float32)})
    with pytest.raises(UsageError, match=r"^inputs: ids: shape \[3\] does not fit graph input 'ids' \[1, \?\]$"):
        tracediff.capture_file(tiny_model(), tmp_path / "o", inputs={"ids": IDS[0]})


def _refused(tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    inputs = _inputs_file(tmp_path, {"kwargs.ids": torch.from_numpy(IDS)})
    code = main(["capture", str(model_path), "--inputs", str(inputs), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()
    return err.removeprefix("tracediff capture: error: ").rstrip("\n")


def _external(tmp_path: Path, location: str, *, length: int | None = None) -> Path:
    """tiny_model() with its embedding's data in ``location`` (written there only when it is a plain name)."""
    model = tiny_model()
    embed = model.graph.initializer[0]
    data = embed.raw_data or EMBED.tobytes()
    embed.ClearField("raw_data")
    embed.ClearField("float_data")
    embed.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(length or len(data)))):
        entry = embed.external_data.add()
        entry.key, entry.value = key, value
    if "/" not in location and not os.path.isabs(location) and not (tmp_path / location).exists():
        (tmp_path / location).write_bytes(data)
    return _model_file(tmp_path, model)


def test_external_data_inside_the_folder_is_read(tmp_path: Path) -> None:
    import tracediff

    session = tracediff.capture_file(_external(tmp_path, "weights.bin"), tmp_path / "o", inputs={"ids": IDS})
    assert session.complete


def test_external_data_outside_the_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "secret.bin").write_bytes(EMBED.tobytes())
    folder = tmp_path / "m"
    folder.mkdir()
    model = _external(folder, "../secret.bin")
    assert _refused(folder, model, capsys) == (f"{model}: tensor 'embed' keeps its data in '../secret.bin', "
                                               "outside the model's folder; refused")
    absolute = _external(folder, str(tmp_path / "secret.bin"))
    assert _refused(folder, absolute, capsys) == (f"{absolute}: tensor 'embed' keeps its data in "
                                                  f"'{tmp_path / 'secret.bin'}', outside the model's folder; refused")


def test_a_symlinked_external_data_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "real.bin").write_bytes(EMBED.tobytes())
    (tmp_path / "weights.bin").symlink_to(tmp_path / "real.bin")  # inside the folder, and still a link
    model = _external(tmp_path, "weights.bin")
    assert _refused(tmp_path, model, capsys) == (f"{model}: tensor 'embed' keeps its data in 'weights.bin', a "
                                                 "symbolic link; refused")


def test_external_data_shorter_than_the_tensor_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "weights.bin").write_bytes(EMBED.tobytes()[:100])
    model = _external(tmp_path, "weights.bin", length=EMBED.nbytes)
    assert _refused(tmp_path, model, capsys) == (f"{model}: tensor 'embed' needs bytes 0 to 160 of weights.bin, "
                                                 "which holds 100; the file is truncated")


def test_a_truncated_model_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _model_file(tmp_path)
    path.write_bytes(path.read_bytes()[:-7])
    assert _refused(tmp_path, path, capsys).startswith(f"{path}: not an ONNX model (the protobuf does not parse")


def test_a_file_that_is_no_model_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"")  # parses as an empty protobuf
    assert _refused(tmp_path, path, capsys) == f"{path}: not an ONNX model (it holds no graph nodes)"


def test_name_scopes_are_read_as_a_literal_never_evaluated() -> None:
    assert parse_name_scopes("['', 'model', 'model.layers.0', 'linear']") == ["", "model", "model.layers.0",
                                                                            "linear"]
    assert parse_name_scopes("__import__('os').system('true')") is None
    assert parse_name_scopes("[1, 2]") is None
    assert parse_name_scopes("['a'") is None


@pytest.mark.parametrize("text", [
    "['', 'model', 'model.layers.0', 'model.layers.0.self_attn', 'linear_4']", "['a']", "['a' , 'b']", "[]",
    "[\"it's\"]", "['a\\\\n']", "['a\\'b']", "['a', 'b',]", "['a' 'b']", "['a', x]", "['a']]", " ['a']",
    "['a\nb']", "['a\rb']", "['a\x00b']", "['a',\u2003'b']", "['a',\n 'b']", "['\u00e9', '-']", "['a', ['b']]"])
def test_name_scopes_read_quickly_are_what_a_python_literal_holds(text: str) -> None:
    """The exporter's plain lists are read without ``ast``: the result must be the literal's, whatever the text."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = None
    expected = value if isinstance(value, list) and all(isinstance(item, str) for item in value) else None
    assert parse_name_scopes(text) == expected


def test_the_legacy_exporter_node_name_is_its_module_path() -> None:
    node = helper.make_node("MatMul", ["a", "b"], ["c"], name="/model/layers.0/self_attn/q_proj/MatMul")
    assert scope_of(node) == (("model", "model.layers.0", "model.layers.0.self_attn",
                               "model.layers.0.self_attn.q_proj"), "MatMul", "node_name")
    assert scope_of(helper.make_node("MatMul", ["a", "b"], ["c"], name="MatMul_12")) == (None, None, "none")
    assert [short_name(n, "Op") for n in ("linear_14", "Mul_1", "_unsafe_view_1", None)] == [
        "linear", "Mul", "_unsafe_view", "Op"]


def test_a_model_onnx_runtime_cannot_load_is_refused_in_its_words(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    model = tiny_model()
    model.ir_version = 99
    path = _model_file(tmp_path, model)
    assert _refused(tmp_path, path, capsys).startswith(
        f"{path}: ONNX Runtime could not load it: FAIL: Unsupported model IR version: 99, max supported IR version: ")
