"""Every kind of trace tracediff writes conforms to ``tracediff/trace_schema.json``.

Besides these explicit cases, ``tests/conftest.py`` validates every trace
any test writes, as it is written (``tests/format/conformance.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff
from tests.format.conformance import check_folder, problems
from tests.models import Boom, Containers, KwargsModel, OutputKinds, SharedLoop, seeded, tiny_llama, toy_input
from tracediff import format as fmt

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def test_the_schema_is_a_valid_draft_2020_12_schema_shipped_with_the_package() -> None:
    from jsonschema import Draft202012Validator

    schema = fmt.schema()
    Draft202012Validator.check_schema(schema)
    assert set(schema["$defs"]) >= {"trace", "node", "op_node", "backward_node", "tensor_entry", "typed_value",
                                    "metadata", "standard_trace"}
    assert set(schema["$defs"]["metadata"]["properties"]) == set(fmt.METADATA_KEYS)
    assert set(schema["$defs"]["stats"]["properties"]) == set(fmt.STAT_KEYS)


@pytest.mark.parametrize("tensors", ["full", "summary", "repr"])
def test_native_capture_of_llama_conforms(tmp_path: Path, tensors: str) -> None:
    model, inputs = tiny_llama(layers=2)
    with tracediff.capture(model, tmp_path, tensors=tensors):
        model(**inputs)
    assert check_folder(tmp_path) == 3


def test_every_value_kind_repeated_calls_and_later_top_level_calls_conform(tmp_path: Path) -> None:
    for kind in OutputKinds.KINDS:
        model = seeded(OutputKinds, kind)
        with tracediff.capture(model, tmp_path / kind):
            model(toy_input())
            model(toy_input(seed=1))  # a later top-level call: subsequent_calls
    model = seeded(KwargsModel)
    with tracediff.capture(model, tmp_path / "kwargs"):
        model(toy_input(), scale=0.5, mode="mul", sizes=(2, 3), mask=torch.ones(2, 4, dtype=torch.bool),
              extra=object())
    for name, cls in (("shared", SharedLoop), ("containers", Containers)):
        model = seeded(cls)
        with tracediff.capture(model, tmp_path / name):
            model(toy_input())
    assert check_folder(tmp_path) == 3 * (len(OutputKinds.KINDS) + 3)


def test_a_trace_cut_short_by_an_exception_conforms(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), Boom())
    with pytest.raises(ValueError):
        with tracediff.capture(model, tmp_path):
            model(toy_input())
    assert json.loads((tmp_path / fmt.METADATA_FILE).read_text())["complete"] is False
    assert check_folder(tmp_path) == 3


def test_backward_capture_conforms(tmp_path: Path) -> None:
    model, inputs = tiny_llama(layers=2)
    with tracediff.capture(model, tmp_path, backward=True):
        model(**inputs).logits.sum().backward()
    tree = json.loads(next(tmp_path.glob(f"*{fmt.FULL_SUFFIX}")).read_text())
    assert tree[fmt.BACKWARD]
    assert check_folder(tmp_path) == 3


def test_op_level_capture_conforms(tmp_path: Path) -> None:
    model, inputs = tiny_llama(layers=1)
    with tracediff.capture(model, tmp_path, ops=["matmul", "softmax"]):
        model(**inputs)
    tree = json.loads(next(tmp_path.glob(f"*{fmt.FULL_SUFFIX}")).read_text())
    assert '"op": "torch.' in json.dumps(tree)
    assert check_folder(tmp_path) == 3


@pytest.mark.parametrize("use_repr", [False, True])
def test_drop_in_output_conforms_to_the_standard_trace(tmp_path: Path, use_repr: bool) -> None:
    model, inputs = tiny_llama(layers=3)
    with tracediff.model_addition_debugger_context(model, debug_path=str(tmp_path), use_repr=use_repr):
        model(**inputs)
    assert check_folder(tmp_path) == 2


def test_committed_fixtures_conform() -> None:
    assert check_folder(FIXTURES) == 13  # six trace folders, one of them native


def test_the_schema_rejects_what_the_specification_forbids() -> None:
    tensor = {"shape": "torch.Size([2])", "dtype": "torch.float32", "stats": {"numel": 2}, "device": "cpu"}
    node = {"module_path": "M", "module_type": "M", "call_index": 0, "inputs": {"args": [tensor]}, "outputs": tensor}
    assert problems(node, "trace") == []
    bad = [
        {**node, "call_index": -1},                                    # call indices count from 0
        {**node, "outputs": "tensor([1., 2.])"},                       # bare strings are the standard trace's
        {**node, "outputs": {**tensor, "value": "/abs/x.safetensors"}},  # payloads are ./name.safetensors
        {**node, "outputs": {**tensor, "shape": "[2]"}},               # shape is the repr of a torch.Size
        {**node, "outputs": {"py_type": "int"}},                       # a typed value holds py_value or repr
        {**node, "outputs": {"py_type": "int", "py_value": 1, "repr": "1"}},
        {**node, "inputs": {"args": [], "extra": []}},                 # inputs hold args and kwargs only
    ]
    for case in bad:
        assert problems(case, "trace"), case


def test_the_specification_s_hand_written_trace_is_read_validated_and_aligned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example of docs/trace-format.md, section 11, written without tracediff, is a valid trace."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "trace-format.md").read_text()
    section = doc.split("## 11.", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "trace").mkdir()
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "trace-format.md", "exec"), {})  # noqa: S102 - our own documentation's example
    assert check_folder(tmp_path / "trace") == 3
    trace = tracediff.load_trace(tmp_path / "trace")
    assert [n.module_path for n in trace.nodes()] == ["M", "M.proj"]
    assert tracediff.align(tmp_path / "trace", tmp_path / "trace").passed
