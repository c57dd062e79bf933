"""The OpenVINO adapter: an IR or an ``openvino.Model`` captured on the CPU at the plugin's defaults.

A tiny transformers Llama (hidden 32, 2 layers, 8 tokens, seeded random weights) is converted once per module
with ``ov.convert_model`` and saved as an IR without weight compression; every capture reads it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

INSTALL = 'pip install -c constraints.txt -e ".[openvino]"'
ov = pytest.importorskip("openvino", reason=f"openvino is not installed: {INSTALL}")
pytest.importorskip("transformers", reason="transformers is not installed (the test extra)")

from tracediff.capturing.adapters.openvino import OpenVINOAdapter, check_ir  # noqa: E402
from tracediff.capturing.adapters.openvino_graph import graph_nodes, scope_chain, split_friendly_name  # noqa: E402
from tracediff.cli.main import main as cli_main  # noqa: E402
from tracediff.errors import UsageError  # noqa: E402

SEQ = 8
PREFIX = "tracediff capture: error: "


def _cli(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli_main(argv)
    return code, out.getvalue()


def tiny_llama() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, max_position_embeddings=32)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):  # ones at init: OpenVINO would fold the product away
                param.uniform_(0.5, 1.5)
    ids = torch.randint(0, 64, (1, SEQ), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@pytest.fixture(scope="module")
def ir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean IR (f32 weights) and the inputs file beside it."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("openvino-ir")
    model, inputs = tiny_llama()
    model.config.use_cache = False  # torch.jit.trace takes no cache object
    converted = ov.convert_model(model, example_input=inputs)
    ov.save_model(converted, str(folder / "llama.xml"), compress_to_fp16=False)
    save_file({f"kwargs.{k}": v.contiguous() for k, v in inputs.items()}, str(folder / "inputs.safetensors"))
    return folder / "llama.xml"


def test_scope_chain_joins_numbered_segments() -> None:
    assert scope_chain("model.layers.0.self_attn.q_proj") == [
        "model", "model.layers.0", "model.layers.0.self_attn", "model.layers.0.self_attn.q_proj"]
    assert scope_chain("lm_head") == ["lm_head"]
    assert scope_chain(None) is None


def test_friendly_names_give_module_paths() -> None:
    assert split_friendly_name("__module.model.layers.0.self_attn.q_proj/aten::linear/MatMul") == (
        "MatMul", "model.layers.0.self_attn.q_proj")
    assert split_friendly_name("__module/aten::add/Add_1") == ("Add_1", None)
    assert split_friendly_name("ShapeOf_10850") == ("ShapeOf_10850", None)


def _graph(middle_neighbour: str) -> Any:
    import openvino.opset13 as ops

    x = ops.parameter([1, 4], name="x")
    first = ops.multiply(x, ops.constant(2.0, dtype=float))
    first.set_friendly_name("__module.model.norm/aten::mul/Multiply")
    middle = ops.relu(first)
    middle.set_friendly_name("Relu_17")  # made by a transformation: no module prefix
    last = ops.add(middle, ops.constant(1e-6, dtype=float))
    last.set_friendly_name(f"{middle_neighbour}/aten::add/Add")
    root = ops.sqrt(last)
    root.set_friendly_name("__module.model.norm/aten::rsqrt/Sqrt")
    return ov.Model([root], [x], "g")


def test_unnamed_op_between_two_ops_of_one_scope_belongs_to_it() -> None:
    nodes = {node.name: node for node in graph_nodes(_graph("__module.model.norm").get_ordered_ops())}
    assert nodes["Relu_17"].scope == ["model", "model.norm"]
    assert nodes["Add"].attributes["epsilon"] == pytest.approx(1e-6)
    assert nodes["Add"].sources == ["Relu_17:0", "Constant_" + nodes["Add"].sources[1].split("_", 1)[1]]


def test_unnamed_op_between_two_scopes_stays_unscoped() -> None:
    nodes = {node.name: node for node in graph_nodes(_graph("__module.model.layers.0").get_ordered_ops())}
    assert nodes["Relu_17"].scope is None
    assert nodes["Add"].scope == ["model", "model.layers.0"]


def test_an_op_merged_from_two_layers_belongs_to_the_scope_they_share() -> None:
    """OpenVINO keeps one of two layers' identical ops and names it after layer 0: layer 1 reads it too."""
    import openvino.opset13 as ops

    x = ops.parameter([1, 4], name="x")
    shared = ops.unsqueeze(x, ops.constant([0]))
    shared.set_friendly_name("__module.model.layers.0.self_attn/aten::unsqueeze/Unsqueeze")
    outputs = []
    for layer in (0, 1):
        reader = ops.multiply(shared, ops.constant(2.0, dtype=float))
        reader.set_friendly_name(f"__module.model.layers.{layer}.self_attn/aten::mul/Multiply")
        outputs.append(reader)
    nodes = {(node.scope or [""])[-1] + "." + node.name: node
             for node in graph_nodes(ov.Model(outputs, [x], "g").get_ordered_ops())}
    assert nodes["model.Unsqueeze"].scope == ["model"]
    assert nodes["model.layers.1.self_attn.Multiply"].scope == ["model", "model.layers.1", "model.layers.1.self_attn"]


def test_capture_records_scopes_ops_dataflow_and_precision(ir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ov"
    code, text = _cli(["capture", str(ir), "--inputs", str(ir.parent / "inputs.safetensors"), "--out", str(out)])
    assert code == 0, text
    metadata = json.loads((out / "tracediff_metadata.json").read_text())
    runtime = metadata["runtime"]
    default = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    assert runtime["inference_precision"] == default and runtime["precision_hint"] is None
    assert runtime["device"] == "CPU" and list(runtime["weight_types"]) == ["f32"]
    assert metadata["graph"]["scopes"] == "modules"
    tree = json.loads(next(out.glob("*_FULL_TENSORS.json")).read_text())
    nodes = {node["module_path"]: node for node in _walk(tree)}
    q = nodes["OpenVINOModel.model.layers.0.self_attn.q_proj.MatMul"]
    assert q["module_type"] == "MatMul"
    assert q["scopes"] == ["model", "model.layers.0", "model.layers.0.self_attn", "model.layers.0.self_attn.q_proj"]
    assert q["sources"][0]["module_path"] == "OpenVINOModel.model.layers.0.input_layernorm.Multiply_1"
    eps = nodes["OpenVINOModel.model.layers.1.input_layernorm.Add"]["attributes"]["epsilon"]
    assert eps == pytest.approx(1e-6)


def _walk(node: Any) -> Any:
    if isinstance(node, dict):
        if "module_path" in node:
            yield node
        for child in node.get("children", []) or []:
            yield from _walk(child)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def test_capture_file_takes_an_openvino_model_and_leaves_it_unchanged(ir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    import tracediff

    model = ov.Core().read_model(str(ir))
    outputs = len(model.outputs)
    inputs = load_file(str(_inputs(ir)))
    tracediff.capture_file(model, tmp_path / "ov", inputs=inputs, options={"precision": "f32"})
    metadata = json.loads((tmp_path / "ov" / "tracediff_metadata.json").read_text())
    assert metadata["runtime"]["inference_precision"] == "f32" and "compute_dtype" not in metadata
    assert len(model.outputs) == outputs  # the outputs were added to a copy


def test_precision_option_sets_the_hint_and_metadata_reads_it_back(ir: Path) -> None:
    prepared = OpenVINOAdapter().load(ir, {"precision": "f32"})
    runtime = OpenVINOAdapter().metadata(prepared)["runtime"]
    assert (runtime["precision_hint"], runtime["inference_precision"]) == ("f32", "f32")


def test_a_graph_input_the_file_lacks_is_named(ir: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    inputs = tmp_path / "ids.safetensors"
    save_file({"kwargs.input_ids": torch.zeros(1, SEQ, dtype=torch.int64)}, str(inputs))
    code, text = _cli(["capture", str(ir), "--inputs", str(inputs), "--out", str(tmp_path / "out")])
    assert code == 2
    assert text.strip().splitlines()[-1] == (f"{PREFIX}{inputs}: graph input 'attention_mask' is not in "
                                             "the file (it holds kwargs.input_ids)")
    assert not (tmp_path / "out").exists()


def test_inputs_by_position_are_fed(ir: Path) -> None:
    adapter = OpenVINOAdapter()
    prepared = adapter.load(ir, {})
    ids = torch.ones(1, SEQ, dtype=torch.int64)
    names = [sorted(names)[0] for names, _ in prepared.inputs]
    feed = prepared.feed({"args.0": ids, "args.1": ids})
    assert sorted(feed) == sorted(names)


# --- untrusted files ------------------------------------------------------------------------------------------


def _copy(ir: Path, folder: Path) -> Path:
    folder.mkdir()
    shutil.copyfile(ir, folder / "m.xml")
    shutil.copyfile(ir.with_suffix(".bin"), folder / "m.bin")
    return folder / "m.xml"


def _inputs(ir: Path) -> Path:
    return ir.parent / "inputs.safetensors"


def _refused(xml: Path, tmp_path: Path, inputs: Path) -> str:
    code, text = _cli(["capture", str(xml), "--inputs", str(inputs), "--out", str(tmp_path / "never")])
    lines = text.strip().splitlines()
    assert code == 2 and len(lines) == 1, text
    return lines[0]


def test_symlinked_bin_is_refused(ir: Path, tmp_path: Path) -> None:
    xml = _copy(ir, tmp_path / "a")
    (tmp_path / "a" / "m.bin").rename(tmp_path / "a" / "real.bin")
    os.symlink(tmp_path / "a" / "real.bin", tmp_path / "a" / "m.bin")  # even to a file beside it
    with pytest.raises(UsageError, match=r"m\.bin: a symbolic link; refused"):
        check_ir(xml)


def test_symlinked_xml_is_refused(ir: Path, tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    os.symlink(ir, tmp_path / "b" / "m.xml")
    with pytest.raises(UsageError, match=r"m\.xml: a symbolic link; refused"):
        check_ir(tmp_path / "b" / "m.xml")


def test_bin_outside_the_folder_is_refused(ir: Path, tmp_path: Path) -> None:
    xml = _copy(ir, tmp_path / "c")
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "c" / "m.bin").rename(outside / "m.bin")
    os.symlink(outside / "m.bin", tmp_path / "c" / "m.bin")
    line = _refused(xml, tmp_path, _inputs(ir))
    assert line == f"{PREFIX}{tmp_path / 'c' / 'm.bin'}: a symbolic link; refused (give the IR's own files)"


def test_truncated_bin_is_refused(ir: Path, tmp_path: Path) -> None:
    xml = _copy(ir, tmp_path / "d")
    data = (tmp_path / "d" / "m.bin").read_bytes()
    (tmp_path / "d" / "m.bin").write_bytes(data[: len(data) // 2])
    line = _refused(xml, tmp_path, _inputs(ir))
    assert line.startswith(f"{PREFIX}{xml}: OpenVINO could not read it: ") and "weights" in line


def test_truncated_xml_is_refused(ir: Path, tmp_path: Path) -> None:
    xml = _copy(ir, tmp_path / "e")
    text = xml.read_bytes()
    xml.write_bytes(text[: len(text) // 2])
    assert _refused(xml, tmp_path, _inputs(ir)).startswith(f"{PREFIX}{xml}: OpenVINO could not read it: ")


def test_garbage_xml_is_refused_before_openvino_guesses_a_frontend(ir: Path, tmp_path: Path) -> None:
    xml = tmp_path / "m.xml"
    xml.write_text("node { name: 'x' op: 'Placeholder' }")  # TensorFlow's text format: not an IR
    assert _refused(xml, tmp_path, _inputs(ir)) == f"{PREFIX}{xml}: not an OpenVINO IR (no <net> element at its start)"


def test_xml_with_entities_is_refused(ir: Path, tmp_path: Path) -> None:
    xml = tmp_path / "m.xml"
    xml.write_text('<?xml version="1.0"?><net name="x" version="11"><!DOCTYPE a [<!ENTITY b "c">]></net>')
    assert _refused(xml, tmp_path, _inputs(ir)) == f"{PREFIX}{xml}: declares a DTD or entities; refused"
