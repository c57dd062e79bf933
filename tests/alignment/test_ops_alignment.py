"""Op alignment: bugs planted inside an attention forward are named down to the op."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff
from tests.alignment import ops_models
from tracediff.cli.main import main

ATTN = "LlamaModel.layers.1.self_attn"


def _capture(model: nn.Module, folder: Path, **options: object) -> Path:
    with torch.no_grad(), tracediff.capture(model, folder, **options):  # type: ignore[arg-type]
        model(input_ids=ops_models.input_ids())
    return folder


@pytest.fixture(scope="module")
def reference_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _capture(ops_models.reference(), tmp_path_factory.mktemp("ops") / "reference", ops=True)


@pytest.mark.parametrize(("bug", "op", "tensor", "origin"), [
    # k is not rotated: the first op that reads it (q @ k^T) gets a different input
    ("rotary_q_only", "torch.matmul", "inputs.args.1", "between modules"),
    # heads k0 k1 k0 k1 instead of k0 k0 k1 k1: named at the repeat, whose input matches and whose output, as
    # q @ k^T reads it through an unrecorded transpose, does not (A's repeat_kv is views only: no op of A)
    ("gqa_mapping", "torch.Tensor.repeat", "outputs", "introduced"),
    # the scores are scaled by the wrong factor: the multiplication itself introduces the error
    ("scale", "torch.Tensor.mul", "outputs", "introduced"),
])
def test_a_bug_inside_attention_is_named_down_to_the_op(reference_trace: Path, tmp_path: Path, bug: str, op: str,
                                                        tensor: str, origin: str) -> None:
    port = _capture(ops_models.port(bug), tmp_path / bug, ops=True)
    result = tracediff.align(reference_trace, port)
    first = result.first_divergence
    assert first is not None
    assert (first.module_path_a, first.module_path_b, first.op, first.tensor, first.origin) == (
        ATTN, ATTN, op, tensor, origin)
    assert first.describe().startswith(f"{op} #{first.op_index} inside {ATTN} {tensor}: max_abs_err=")
    before = [row for row in result.rows if row.order < first.order]
    assert all(row.within_tolerance for row in before)  # layer 0 and layer 1's earlier ops all match
    if bug == "scale":
        (diff,) = result.argument_diffs
        assert diff.slot == f"op #{first.op_index} torch.Tensor.mul inputs.args.1"
        assert (diff.value_a, diff.value_b) == (pytest.approx(8 ** -0.5), 1 / 8)


def test_explicit_matmul_softmax_pairs_with_sdpa_by_value(tmp_path: Path) -> None:
    plain = ops_models.plant(ops_models.tiny_llama("eager"), [0, 1])  # matmul + softmax, repeat_interleave
    fused = ops_models.tiny_llama("sdpa")  # torch's scaled_dot_product_attention
    result = tracediff.align(_capture(plain, tmp_path / "a", ops=True), _capture(fused, tmp_path / "b", ops=True))
    assert result.passed
    by_value = [row for row in result.rows if row.matched_by == "value"]
    assert [(row.module_path_b, row.op, row.tensor_a.split(" #")[0], row.status in ("identical", "close"))
            for row in by_value] == [
        (f"LlamaModel.layers.{i}.self_attn", "torch.nn.functional.scaled_dot_product_attention", "torch.matmul", True)
        for i in (0, 1)]
    # what sdpa never materializes (repeated heads, scores, probabilities) is unmatched, not an error
    unmatched = {u.tensor.split(" ", 2)[2] for u in result.unmatched_a
                 if u.module_path == ATTN and u.tensor and u.tensor.startswith("op #")}
    assert {"torch.repeat_interleave", "torch.softmax"} <= unmatched


def test_a_wrong_scale_in_sdpa_is_found_against_explicit_attention(tmp_path: Path) -> None:
    plain = ops_models.plant(ops_models.tiny_llama("eager"), [0, 1])
    fused = ops_models.tiny_llama("sdpa")
    fused.layers[1].self_attn.scaling = 0.5
    result = tracediff.align(_capture(plain, tmp_path / "a", ops=True), _capture(fused, tmp_path / "b", ops=True))
    first = result.first_divergence
    assert first is not None
    assert (first.module_path_b, first.op, first.matched_by, first.origin) == (
        ATTN, "torch.nn.functional.scaled_dot_product_attention", "value", "introduced")
    assert first.tensor_a.startswith("torch.matmul #")


def test_a_trace_with_ops_aligns_against_one_without(reference_trace: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    plain = _capture(ops_models.reference(), tmp_path / "plain")
    result = tracediff.align(reference_trace, plain)
    assert result.passed and all(row.op is None for row in result.rows)
    assert any(u.tensor and u.tensor.startswith("op #0 ") for u in result.unmatched_a)
    assert main(["align", str(reference_trace), str(plain), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert all(row["op"] is None and row["op_index"] is None for row in report["rows"])


def test_op_rows_in_json_carry_op_and_enclosing_module(reference_trace: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    port = _capture(ops_models.port("scale"), tmp_path / "port", ops=True)
    assert main(["align", str(reference_trace), str(port), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    first = report["first_divergence"]
    assert (first["op"], first["module_path_b"], first["tensor"]) == ("torch.Tensor.mul", ATTN, "outputs")
    assert isinstance(first["op_index"], int)
    op_rows = [row for row in report["rows"] if row["op"] is not None]
    assert op_rows and all(isinstance(row["op_index"], int) for row in op_rows)
    assert {row["module_path_b"] for row in op_rows} >= {ATTN, "LlamaModel.layers.1.mlp", "LlamaModel.norm"}
    assert all(row["module_path_a"] == row["module_path_b"] for row in op_rows)


def test_two_step_recipe_zooms_into_the_diverging_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = Path(ops_models.__file__)
    # 1. module level: capture both without ops, align
    for name, function in (("a", "build_reference"), ("b", "build_port_scale")):
        assert main(["capture", f"{spec}:{function}", "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    assert main(["align", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json"]) == 1
    first = json.loads(capsys.readouterr().out)["first_divergence"]
    assert (first["module_path_b"], first["op"]) == ("LlamaModel.layers.1.self_attn.o_proj", None)
    module = first["module_path_b"].rsplit(".", 1)[0].split(".", 1)[1]  # the caller of o_proj, root removed
    # 2. op level, only inside that module
    for name, function in (("a_ops", "build_reference"), ("b_ops", "build_port_scale")):
        assert main(["capture", f"{spec}:{function}", "--out", str(tmp_path / name), "--ops-in", module]) == 0
    capsys.readouterr()
    assert main(["align", str(tmp_path / "a_ops"), str(tmp_path / "b_ops"), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["first_divergence"]["op"], report["first_divergence"]["module_path_b"]) == (
        "torch.Tensor.mul", ATTN)
    assert {row["module_path_b"] for row in report["rows"] if row["op"]} == {
        ATTN, *(f"{ATTN}.{p}_proj" for p in "qkvo")}


def test_reports_name_the_op(reference_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = _capture(ops_models.port("scale"), tmp_path / "port", ops=True)
    result = tracediff.align(reference_trace, port)
    first = result.first_divergence
    assert first is not None
    html = result.to_html()
    # each module's ops sit in a collapsed group; only the group holding the first divergence is open
    assert html.count('<details open class="ops') == 1
    assert html.count('class="ops') == len({(r.module_path_b) for r in result.rows if r.op is not None})
    assert f'title="{ATTN} torch.Tensor.mul #{first.op_index}"' in html
    assert f"torch.Tensor.mul #{first.op_index} inside {ATTN}" in html
    assert main(["align", str(reference_trace), str(port)]) == 1
    text = capsys.readouterr().out
    assert f"FIRST DIVERGENCE (introduced): torch.Tensor.mul #{first.op_index} inside {ATTN} outputs:" in text
    assert f"Tensor.mul #{first.op_index} outputs" in text  # the table's tensor column
