"""``tracediff.align`` on real traces: each test is one situation a user meets, with a known answer.

Bugs are injected at a known module of a second build of the same model, so
the first divergence must be exactly there.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import tracediff
from tests.alignment.helpers import RENAME_RULES, TraceStore, copy_trace, edit_json, json_node, trace_json_path
from tracediff import Alignment, Unmatched, align, load_trace
from tracediff.alignment.result import TensorComparison
from tracediff.compare.metrics import compare_tensors
from tracediff.compare.tolerance import default_tolerance
from tracediff.trace.load import parse_scalar


def _rows(result: Alignment, module_path_b: str, call_index: int | None = None) -> list[TensorComparison]:
    return [r for r in result.rows if r.module_path_b == module_path_b
            and (call_index is None or r.call_index_b == call_index)]


def _inside(path: str, module: str) -> bool:
    return path == module or path.startswith(module + ".")


def _assert_first_divergence(result: Alignment, module_path_b: str, tensor: str = "outputs", *,
                             call_index: int = 0) -> TensorComparison:
    first = result.first_divergence
    assert first is not None and not result.passed
    assert (first.module_path_b, first.call_index, first.tensor) == (module_path_b, call_index, tensor)
    assert first.origin == "introduced"
    assert all(row.within_tolerance is not False for row in result.rows[:first.order])
    return first


# --- nothing wrong ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("a, b", [
    ("llama", "llama-hf"),  # tracediff against transformers' debugger, same weights
    ("llama-hf", "llama"),
    ("gpt2-hf", "gpt2"),
    ("bert", "bert-hf"),
    ("ref", "port"),  # another class name, same submodule names
])
def test_identical_models_pass(traces: TraceStore, a: str, b: str) -> None:
    result = align(traces(a), traces(b))
    assert result.passed and bool(result) and result.first_divergence is None
    assert not result.structural and result.warnings == ()
    assert {row.status for row in result.rows} == {"identical"}
    assert result.unmatched_a == () and result.unmatched_b == ()  # parents without outputs are not "missing"
    trace_b = load_trace(traces(b))
    assert result.matched_nodes == len(trace_b.nodes())
    assert len(result.rows) == min(len(load_trace(traces(a)).records()), len(trace_b.records()))


def test_accepts_loaded_traces(traces: TraceStore) -> None:
    a, b = load_trace(traces("ref")), load_trace(traces("port-fc2-bug"))
    assert align(a, b).to_dict() == align(traces("ref"), traces("port-fc2-bug")).to_dict()


# --- injected bugs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("a, b", [("llama", "llama-up-bug"), ("llama-hf", "llama-hf-up-bug"),
                                  ("llama-hf", "llama-up-bug")])
def test_perturbed_linear_weight_is_the_first_divergence(traces: TraceStore, a: str, b: str) -> None:
    result = align(traces(a), traces(b))
    first = _assert_first_divergence(result, "LlamaModel.layers.1.mlp.up_proj")
    assert first.module_path_a == "LlamaModel.layers.1.mlp.up_proj" and not first.approximate
    assert first.status == "diverged" and first.max_abs_err > 1e-3
    assert first.input_err == 0.0 and first.amplification == math.inf
    later = [row for row in result.rows[first.order + 1:] if row.diverged]
    assert later, "the error must propagate"
    for row in later:  # parents of the buggy module included: the error came from inside them
        assert row.origin == "inherited", row.describe()
    assert result.sources == (first,)
    assert any(row.module_path_b == "LlamaModel.norm" and row.origin == "inherited" for row in later)


def test_changed_norm_eps_is_the_first_divergence(traces: TraceStore) -> None:
    result = align(traces("llama"), traces("llama-eps-bug"))
    first = _assert_first_divergence(result, "LlamaModel.layers.1.input_layernorm")
    assert first.module_type == "LlamaRMSNorm"


def test_gpt2_layer_norm_bias_is_the_first_divergence(traces: TraceStore) -> None:
    _assert_first_divergence(align(traces("gpt2-hf"), traces("gpt2-hf-ln-bug")), "GPT2Model.h.1.ln_2")


def test_root_class_name_is_ignored_and_paths_are_reported_in_full(traces: TraceStore) -> None:
    result = align(traces("ref"), traces("port-fc2-bug"))
    first = _assert_first_divergence(result, "PortModel.layers.1.fc2")
    assert first.module_path_a == "RefModel.layers.1.fc2"
    assert result.model_a == "RefModel" and result.model_b == "PortModel"
    assert not result.structural


def test_different_model_inputs(traces: TraceStore) -> None:
    result = align(traces("ref"), traces("ref-other-input"))
    first = result.first_divergence
    assert first is not None and (first.module_path_b, first.tensor) == ("RefModel", "inputs.args.0")
    assert first.origin == "model inputs"
    assert first.max_abs_err == pytest.approx(1e-3, rel=1e-3)


# --- renamed implementations --------------------------------------------------------------------------------


def test_renamed_modules_without_a_map_match_by_structure(traces: TraceStore) -> None:
    result = align(traces("ref"), traces("renamed"))
    assert result.structural and result.passed
    assert result.warnings[0].startswith("module paths did not line up; nodes were matched by structure")
    assert result.unmatched_a == () and result.unmatched_b == ()
    pairs = {(r.module_path_a, r.module_path_b) for r in result.rows}
    assert ("RefModel.layers.1.fc1", "RenamedPort.blocks.1.up") in pairs
    assert ("RefModel.layers.2.norm", "RenamedPort.blocks.2.ln") in pairs
    assert all(a.split(".", 1)[-1].split(".")[:2] != ["layers", "0"] or "blocks.0" in b for a, b in pairs)
    assert result.suggested_rename


def test_suggested_rename_rules_match_by_name_when_passed_back(traces: TraceStore) -> None:
    structural = align(traces("ref"), traces("renamed"))
    rules = [list(rule) for rule in structural.suggested_rename]
    by_name = align(traces("ref"), traces("renamed"), map=rules)
    assert not by_name.structural and by_name.suggested_rename == ()
    assert by_name.matched_nodes == structural.matched_nodes == len(load_trace(traces("renamed")).nodes())
    assert [(r.module_path_a, r.module_path_b, r.tensor) for r in by_name.rows] == \
        [(r.module_path_a, r.module_path_b, r.tensor) for r in structural.rows]


def test_renamed_modules_with_a_map(traces: TraceStore) -> None:
    result = align(traces("ref"), traces("renamed"), map=RENAME_RULES)
    assert result.passed and not result.structural and result.warnings == ()
    assert result.unmatched_a == () and result.unmatched_b == ()
    buggy = align(traces("ref"), traces("renamed-bug"), map=RENAME_RULES)
    first = _assert_first_divergence(buggy, "RenamedPort.blocks.1.up")
    assert first.module_path_a == "RefModel.layers.1.fc1"


def test_renamed_bug_is_found_by_structure_too(traces: TraceStore) -> None:
    result = align(traces("ref"), traces("renamed-bug"))
    assert result.structural
    first = _assert_first_divergence(result, "RenamedPort.blocks.1.up")
    assert first.module_path_a == "RefModel.layers.1.fc1"


def test_a_partial_map_is_kept_and_structure_pairs_the_rest(traces: TraceStore) -> None:
    """Enough names line up through the map; structure pairs only what the map left, never replacing it."""
    rules = [r for r in RENAME_RULES if r[1] != ".relu"]
    result = align(traces("ref"), traces("renamed"), map=rules)
    assert not result.structural and result.passed
    assert result.unmatched_a == () and result.unmatched_b == ()
    how = {(r.module_path_a, r.module_path_b): r.matched_by for r in result.rows}
    assert {pair for pair, by in how.items() if by == "structure"} == \
        {(f"RefModel.layers.{i}.act", f"RenamedPort.blocks.{i}.relu") for i in range(3)}
    assert how[("RefModel.layers.1.fc1", "RenamedPort.blocks.1.up")] == "map"
    assert how[("RefModel", "RenamedPort")] == "name"
    named = align(traces("ref"), traces("renamed"), map=rules, match="name")
    assert {u.module_path for u in named.unmatched_a} == {f"RefModel.layers.{i}.act" for i in range(3)}
    assert {u.module_path for u in named.unmatched_b} == {f"RenamedPort.blocks.{i}.relu" for i in range(3)}


# --- what the comparison meets ------------------------------------------------------------------------------


def test_nan_written_by_a_module(traces: TraceStore) -> None:
    result = align(traces("ref"), traces("nan"))
    first = _assert_first_divergence(result, "RefModel.layers.1.act")
    assert first.nan_mismatch == 1 and first.status == "diverged"
    assert first.required_atol == math.inf and first.required_rtol == math.inf
    assert "1 NaN where the other side is not" in first.reason


def test_shape_mismatch_is_a_row_not_a_crash(traces: TraceStore) -> None:
    result = align(traces("ref"), traces("wider"))
    first = _assert_first_divergence(result, "RefModel.layers.2.fc1")
    assert first.status == "shape_mismatch" and first.within_tolerance is False
    assert first.reason == "shape differs: [3, 16] vs [3, 12]"
    assert first.shape_a == (3, 16) and first.shape_b == (3, 12) and math.isnan(first.max_abs_err)
    fc2_out = _rows(result, "RefModel.layers.2.fc2")[-1]
    assert fc2_out.tensor == "outputs" and fc2_out.status == "diverged"  # same shape again: compared


def test_extra_module_on_one_side_is_unmatched(traces: TraceStore) -> None:
    result = align(traces("ref"), traces("extra"))
    assert result.passed  # an Identity: nothing downstream changes
    assert result.unmatched_a == ()
    assert result.unmatched_b == (Unmatched("WithExtra.extra", 0),)
    reverse = align(traces("extra"), traces("ref"))
    assert reverse.unmatched_a == (Unmatched("WithExtra.extra", 0),) and reverse.unmatched_b == ()


def test_pruned_layers_are_unrecorded_and_parents_without_outputs_are_fine(traces: TraceStore) -> None:
    result = align(traces("llama3-hf-pruned"), traces("llama3"))
    assert result.passed and result.unmatched_a == () and result.unmatched_b == ()
    assert result.unrecorded_a == ("LlamaModel.layers.1",) and result.unrecorded_b == ()  # only layers.1 was pruned
    assert not result.structural and result.warnings == ()


def test_pruned_standard_traces_find_the_bug_in_the_last_layer(traces: TraceStore) -> None:
    result = align(traces("llama3-hf-pruned"), traces("llama3-hf-pruned-bug"))
    _assert_first_divergence(result, "LlamaModel.layers.2.mlp.up_proj")


# --- repeated calls -----------------------------------------------------------------------------------------


def test_bug_in_the_second_call_of_a_shared_module(traces: TraceStore) -> None:
    result = align(traces("shared"), traces("shared-bug1"))
    first = _assert_first_divergence(result, "SharedThrice.shared", call_index=1)
    assert first.call_index_b == 1 and not first.approximate
    assert all(row.status == "identical" for row in _rows(result, "SharedThrice.shared", 0))
    assert [row.origin for row in _rows(result, "SharedThrice.shared", 2)] == ["inherited", "inherited"]


def test_standard_trace_second_call_is_judged_on_statistics(traces: TraceStore) -> None:
    """transformers' debugger overwrote call 1's payload with call 2's: call 1 is compared on statistics."""
    result = align(traces("shared-hf"), traces("shared-hf-bug1"))
    first = _assert_first_divergence(result, "SharedThrice.shared", call_index=1)
    assert first.approximate and "payload overwritten by a later call" in first.reason


def test_standard_trace_stale_payloads_do_not_make_earlier_calls_diverge(traces: TraceStore) -> None:
    """Only the third call differs; the first two point at its payload but must still pass."""
    result = align(traces("shared-hf"), traces("shared-hf-bug2"))
    first = _assert_first_divergence(result, "SharedThrice.shared", call_index=2)
    assert not first.approximate
    earlier = _rows(result, "SharedThrice.shared", 0) + _rows(result, "SharedThrice.shared", 1)
    assert len(earlier) == 4 and all(row.approximate and row.within_tolerance for row in earlier)


# --- statistics only ----------------------------------------------------------------------------------------


def test_summary_traces_are_compared_approximately(traces: TraceStore) -> None:
    same = align(traces("llama-summary"), traces("llama"))
    assert same.passed and all(row.approximate for row in same.rows)
    assert {row.status for row in same.rows} == {"close"}  # equal statistics never claim "identical"
    buggy = align(traces("llama-summary"), traces("llama-summary-up-bug"))
    first = _assert_first_divergence(buggy, "LlamaModel.layers.1.mlp.up_proj")
    assert first.approximate and first.reason.startswith("compared on statistics only: ")


def test_summary_json_alone(traces: TraceStore, tmp_path: Path) -> None:
    folder = copy_trace(traces("llama-hf-up-bug"), tmp_path / "summary")
    trace_json_path(folder).unlink()
    for path in folder.glob("*.safetensors"):
        path.unlink()
    result = align(traces("llama-hf"), folder)
    assert all(row.approximate or row.status == "no_data" for row in result.rows)
    _assert_first_divergence(result, "LlamaModel.layers.1.mlp.up_proj")


@pytest.mark.parametrize("a, b", [("llama-hf-repr", "llama-hf"), ("llama-hf-repr", "llama"),
                                  ("llama", "llama-hf-repr"), ("bert-hf-repr", "bert"),
                                  ("llama3-hf-repr-pruned", "llama3")])
def test_repr_traces_of_the_same_model_pass(traces: TraceStore, a: str, b: str) -> None:
    """transformers' five-digit statistics against exact ones: rounding is not a divergence."""
    result = align(traces(a), traces(b))
    assert result.passed, [row.describe() for row in result.diverged]
    float_rows = [row for row in result.rows if row.dtype_a == "torch.float32"]
    assert float_rows and all(row.approximate and row.status == "close" for row in float_rows)
    integer_rows = [row for row in result.rows if row.dtype_a == "torch.int64"]
    assert all(row.status == "no_data" and row.within_tolerance is None for row in integer_rows)


def test_repr_traces_find_the_bug(traces: TraceStore) -> None:
    result = align(traces("llama-hf-repr"), traces("llama-hf-repr-up-bug"))
    first = _assert_first_divergence(result, "LlamaModel.layers.1.mlp.up_proj")
    assert first.approximate


def test_statistics_beyond_rounding_still_diverge(traces: TraceStore, tmp_path: Path) -> None:
    folder = copy_trace(traces("ref-hf"), tmp_path / "shifted")

    def shift(tree: dict) -> None:  # B's recorded max 0.1% higher, and no payload to check against
        out = json_node(tree, "RefModel.head")["outputs"]
        out.pop("value")
        out["max"] = f"tensor({parse_scalar(out['max']) * 1.001:.4e})"

    edit_json(folder, shift)
    row = _rows(align(traces("ref-hf"), folder), "RefModel.head")[-1]
    assert row.approximate and row.status == "diverged" and row.reason.startswith("compared on statistics only: max")
    assert row.required_atol > 0


# --- tolerances ---------------------------------------------------------------------------------------------


def test_per_module_tolerance_moves_the_first_divergence(traces: TraceStore) -> None:
    result = align(traces("llama"), traces("llama-up-bug"), atol={"*": 1e-5, "layers.*.mlp": 1.0},
                   rtol={"layers.*.mlp": 10.0})
    first = _assert_first_divergence(result, "LlamaModel.layers.1")
    for row in result.rows:
        in_mlp = ".mlp" in row.module_path_b
        assert row.atol == (1.0 if in_mlp else 1e-5), row.module_path_b
        assert row.rtol == (10.0 if in_mlp else default_tolerance(row.dtype_a, row.dtype_b)[1]), row.module_path_b
    assert result.warnings == ()
    assert first.input_err == 0.0


def test_global_tolerance(traces: TraceStore) -> None:
    assert align(traces("llama"), traces("llama-up-bug"), atol=1.0, rtol=1.0).passed
    strict = align(traces("llama"), traces("llama-up-bug"), atol=0.0, rtol=0.0)
    assert strict.first_divergence is not None and all(row.atol == 0.0 for row in strict.rows)


def test_unused_tolerance_pattern_warns(traces: TraceStore) -> None:
    result = align(traces("llama"), traces("llama"), atol={"layers.*.mpl": 1e-4})
    assert result.passed
    assert result.warnings == ("--atol pattern 'layers.*.mpl' matches no module; did you mean layers.1.mlp, "
                               "layers.0.mlp, layers.1?",)


def test_cross_dtype_rows_use_the_looser_default_and_upcast(traces: TraceStore) -> None:
    result = align(traces("llama"), traces("llama-bf16"))
    floats = [row for row in result.rows if row.dtype_b == "torch.bfloat16"]
    assert floats and all((row.atol, row.rtol) == (1e-5, 1.6e-2) for row in floats)
    assert all(row.dtype_a == "torch.float32" for row in floats)
    row = next(r for r in floats if r.module_path_b.endswith("embed_tokens") and r.tensor == "outputs")
    assert row.reason.endswith("dtype differs: torch.float32 vs torch.bfloat16 (compared in float64)")
    a, b = load_trace(traces("llama")), load_trace(traces("llama-bf16"))
    ta = a.load(next(r for n, r in a.records() if n.module_path == row.module_path_a and r.slot == row.tensor))
    tb = b.load(next(r for n, r in b.records() if n.module_path == row.module_path_b and r.slot == row.tensor))
    assert tb.dtype == torch.bfloat16
    assert row.max_abs_err == pytest.approx(float((ta.double() - tb.double()).abs().max()), rel=1e-6)
    assert row.max_abs_err == compare_tensors(ta, tb, atol=1e-5, rtol=1.6e-2).max_abs_err
    assert row.within_tolerance  # embedding rows rounded to bfloat16 are within bfloat16's tolerance


# --- arguments that are not tensors -------------------------------------------------------------------------


def test_non_tensor_arguments_that_differ(traces: TraceStore) -> None:
    result = align(traces("options-true"), traces("options-false"))
    assert result.passed  # the tensors are identical
    diffs = {(d.module_path_b, d.slot): d for d in result.argument_diffs}
    assert set(diffs) == {("Options", "inputs.kwargs.use_cache"), ("Options", "inputs.kwargs.mode"),
                          ("Options.inner", "inputs.kwargs.mode")}
    use_cache = diffs[("Options", "inputs.kwargs.use_cache")]
    assert (use_cache.value_a, use_cache.value_b) == (True, False)
    assert "True" in use_cache.detail and "False" in use_cache.detail
    mode = diffs[("Options.inner", "inputs.kwargs.mode")]
    assert (mode.value_a, mode.value_b) == ("sum", "mean") and "sum" in mode.detail and "mean" in mode.detail


def test_standard_repr_values_equal_typed_values(traces: TraceStore) -> None:
    assert align(traces("options-hf-true"), traces("options-true")).argument_diffs == ()
    diffs = align(traces("options-hf-true"), traces("options-false")).argument_diffs
    assert {d.slot for d in diffs} == {"inputs.kwargs.use_cache", "inputs.kwargs.mode"}


# --- payloads that cannot be read ---------------------------------------------------------------------------


def _head_output_rows(result: Alignment) -> list[TensorComparison]:
    return [r for r in result.rows if r.tensor == "outputs" and r.module_path_b.endswith(("head", "RefModel"))]


def test_missing_payload_is_an_unreadable_row(traces: TraceStore, tmp_path: Path) -> None:
    folder = copy_trace(traces("ref-hf"), tmp_path / "missing")
    (folder / "RefModel.head_outputs.safetensors").unlink()
    result = align(traces("ref-hf"), folder)
    (row,) = _head_output_rows(result)
    assert row.status == "unreadable" and row.within_tolerance is None
    assert row.reason == f"{folder.resolve()}/RefModel.head_outputs.safetensors: payload file is missing"
    assert not result.passed and result.first_divergence is None and result.unreadable == [row]
    assert all(r.status == "identical" for r in result.rows if r is not row)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_payload_is_an_unreadable_row(traces: TraceStore, tmp_path: Path, damage: str) -> None:
    folder = copy_trace(traces("ref-hf"), tmp_path / damage)
    path = folder / "RefModel.head_outputs.safetensors"
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) - 5], "garbage": b"\x07" * 64, "empty": b""}[damage])
    result = align(traces("ref-hf"), folder)
    (row,) = _head_output_rows(result)
    assert row.status == "unreadable"
    assert row.reason.startswith(f"{folder.resolve()}/RefModel.head_outputs.safetensors: "
                                 "not a readable safetensors file (")
    assert not result.passed
    assert all(r.status == "identical" for r in result.rows if r is not row)
    with pytest.raises(AssertionError, match="unreadable: RefModel.head outputs: "):
        tracediff.assert_traces_close(traces("ref-hf"), folder)


@pytest.mark.parametrize("value, why", [("/etc/passwd", "is absolute"),
                                        ("../x.safetensors", "leaves the trace directory")])
def test_refused_payload_path_is_an_unreadable_row(traces: TraceStore, tmp_path: Path, value: str, why: str) -> None:
    folder = copy_trace(traces("ref-hf"), tmp_path / "edited")
    (tmp_path / "x.safetensors").write_bytes((folder / "RefModel.head_outputs.safetensors").read_bytes())

    def point_outside(tree: dict) -> None:
        json_node(tree, "RefModel.head")["outputs"]["value"] = value

    edit_json(folder, point_outside)
    result = align(traces("ref-hf"), folder)
    (row,) = _head_output_rows(result)
    assert row.status == "unreadable"
    assert row.reason == f"{folder}: tensor path {value!r} {why}; refused"
    assert all(r.status == "identical" for r in result.rows if r is not row)


def test_symlink_out_of_the_trace_is_an_unreadable_row(traces: TraceStore, tmp_path: Path) -> None:
    folder = copy_trace(traces("ref-hf"), tmp_path / "linked")
    payload = folder / "RefModel.head_outputs.safetensors"
    outside = tmp_path / "outside.safetensors"
    payload.rename(outside)
    payload.symlink_to(outside)
    (row,) = _head_output_rows(align(traces("ref-hf"), folder))
    assert row.status == "unreadable"
    assert row.reason == (f"{folder}: tensor path './RefModel.head_outputs.safetensors' "
                          "links outside the trace directory; refused")
