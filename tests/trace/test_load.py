"""``tracediff.load_trace``: which file is read, what a node and a tensor record hold, and what is never read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import safetensors
import torch

import tracediff
from tests.alignment.helpers import (
    INPUT_IDS,
    TraceStore,
    copy_trace,
    edit_json,
    json_node,
    ref_model,
    toy_input,
    trace_json_path,
)
from tracediff import TraceFormatError, UnsafePathError, load_trace
from tracediff.trace.load import parse_scalar, parse_shape
from tracediff.trace.model import ReprValue


def _node(trace: tracediff.Trace, path: str, call_index: int = 0) -> tracediff.Node:
    (node,) = [n for n in trace.nodes() if n.module_path == path and n.call_index == call_index]
    return node


def _slots(records: list[tracediff.TensorRecord]) -> list[str]:
    return [r.slot for r in records]


# --- which file ---------------------------------------------------------------------------------------------


def test_folder_with_both_files_reads_full_tensors(traces: TraceStore) -> None:
    folder = traces("llama-hf")
    trace = load_trace(folder)
    assert trace.json_path == folder / "LlamaModel_debug_tree_FULL_TENSORS.json"
    assert trace.directory == folder
    assert not trace.summary_only
    assert all(record.payload is not None for _, record in trace.records())


def test_summary_json_alone_is_accepted(traces: TraceStore, tmp_path: Path) -> None:
    folder = copy_trace(traces("llama-hf"), tmp_path / "summary-only")
    trace_json_path(folder).unlink()
    trace = load_trace(folder)
    assert trace.json_path.name == "LlamaModel_debug_tree_SUMMARY.json"
    assert trace.summary_only
    full = load_trace(traces("llama-hf"))
    assert [(n.module_path, r.slot, r.shape, r.stats) for n, r in trace.records()] == \
        [(n.module_path, r.slot, r.shape, r.stats) for n, r in full.records()]
    assert not any(record.payload for _, record in trace.records())


def test_a_json_file_is_read_as_given(traces: TraceStore) -> None:
    folder = traces("llama-hf")
    trace = load_trace(folder / "LlamaModel_debug_tree_SUMMARY.json")
    assert trace.summary_only and trace.directory == folder


def test_folder_with_two_traces_is_refused(traces: TraceStore, tmp_path: Path) -> None:
    folder = copy_trace(traces("llama-hf"), tmp_path / "two")
    (folder / "Other_debug_tree_FULL_TENSORS.json").write_text(trace_json_path(folder).read_text())
    with pytest.raises(TraceFormatError) as e:
        load_trace(folder)
    assert str(e.value) == (f"{folder}: holds several traces (LlamaModel_debug_tree_FULL_TENSORS.json, "
                            "Other_debug_tree_FULL_TENSORS.json); pass the JSON file to use")


# --- what a trace holds -------------------------------------------------------------------------------------


def test_transformers_trace_with_payloads(traces: TraceStore) -> None:
    trace = load_trace(traces("llama-hf"))
    assert trace.producer == "transformers" and trace.metadata == {}
    assert trace.model_name == "LlamaModel"
    root = trace.roots[0]
    assert (root.module_path, root.relative_path, root.call_index) == ("LlamaModel", "", 0)
    assert _slots(root.tensors) == ["inputs.kwargs.input_ids"]  # transformers drops the outputs of parents
    layer = _node(trace, "LlamaModel.layers.1")
    assert layer.relative_path == "layers.1" and not layer.has_outputs and layer.outputs() == []
    up = _node(trace, "LlamaModel.layers.1.mlp.up_proj")
    assert up.has_outputs and _slots(up.tensors) == ["inputs.args.0", "outputs"]
    assert (up.relative_path, up.call_index) == ("layers.1.mlp.up_proj", 0)
    out = up.outputs()[0]
    assert out.shape == (1, 6, 64) and out.dtype == "torch.float32"
    assert out.payload == "./LlamaModel.layers.1.mlp.up_proj_outputs.safetensors" and out.has_payload
    tensor = trace.load(out)
    assert tensor.shape == (1, 6, 64)
    # statistics parsed from transformers' strings ("tensor(1.2345e-02)"), 5 significant digits
    assert set(out.stats) == {"mean", "std", "min", "max"}
    assert out.stats["mean"] == pytest.approx(float(tensor.mean()), rel=1e-4, abs=1e-9)
    assert out.stats["std"] == pytest.approx(float(tensor.std()), rel=1e-4)
    assert out.stats["max"] == pytest.approx(float(tensor.max()), rel=1e-4)
    ids = root.tensors[0]
    assert ids.dtype == "torch.int64" and ids.stats == {}  # transformers records no statistics for integers
    assert torch.equal(trace.load(ids), INPUT_IDS)


def test_transformers_trace_with_repr(traces: TraceStore) -> None:
    trace = load_trace(traces("llama-hf-repr"))
    records = [record for _, record in trace.records()]
    assert records and all(r.payload is None and not r.has_payload for r in records)
    assert all(isinstance(r.repr_lines, tuple) and r.repr_lines[0].startswith("tensor(") for r in records)
    floats = [r for r in records if r.dtype == "torch.float32"]
    assert floats and all(set(r.stats) == {"mean", "std", "min", "max"} for r in floats)
    with pytest.raises(TraceFormatError, match="has no payload"):
        trace.load(records[0])


def test_tracediff_trace(traces: TraceStore) -> None:
    trace = load_trace(traces("shared"))
    assert trace.producer == "tracediff"
    assert trace.metadata["tracediff_version"] == tracediff.__version__
    assert trace.metadata["model_name"] == "SharedThrice"
    calls = [n for n in trace.nodes() if n.relative_path == "shared"]
    assert [n.call_index for n in calls] == [0, 1, 2]
    assert all(n.module_type == "CountingLinear" for n in calls)
    assert len({n.outputs()[0].payload for n in calls}) == 3  # one payload per call
    root = trace.roots[0]
    assert root.has_outputs and _slots(root.tensors) == ["inputs.args.0", "outputs"]  # parents keep outputs
    for _, record in trace.records():
        tensor = trace.load(record).double()
        assert record.stats["numel"] == tensor.numel()
        scale = float(tensor.abs().mean())  # float32 sums: errors relative to the magnitude, not to the mean
        assert record.stats["mean"] == pytest.approx(float(tensor.mean()), abs=1e-6 * scale)
        assert record.stats["std"] == pytest.approx(float(tensor.std()), rel=1e-5)
        assert record.stats["min"] == float(tensor.min()) and record.stats["max"] == float(tensor.max())
        assert record.stats["abs_mean"] == pytest.approx(scale, rel=1e-6)


def test_tracediff_non_tensor_values_are_typed(traces: TraceStore) -> None:
    trace = load_trace(traces("options-true"))
    root = trace.roots[0]
    assert root.values == {"inputs.kwargs.use_cache": True, "inputs.kwargs.mode": "sum"}
    assert _node(trace, "Options.inner").values == {"inputs.kwargs.mode": "sum"}
    standard = load_trace(traces("options-hf-true"))
    assert standard.roots[0].values == {"inputs.kwargs.use_cache": "True", "inputs.kwargs.mode": "'sum'"}  # reprs
    assert all(isinstance(v, ReprValue) for v in standard.roots[0].values.values())


def test_payloads_are_opened_only_on_demand(traces: TraceStore, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real = safetensors.safe_open

    def spy(path: str, *args: object, **kwargs: object) -> object:
        opened.append(os.path.basename(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", spy)
    trace = load_trace(traces("llama"))
    pairs = trace.records()
    assert len(pairs) > 50 and opened == []
    node, record = pairs[5]
    trace.load(record)
    assert opened == [Path(record.payload).name]


# --- execution order ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama", "llama-hf", "shared"])
def test_inputs_at_call_start_outputs_at_return(traces: TraceStore, name: str) -> None:
    trace = load_trace(traces(name))
    orders = [record.order for _, record in trace.records()]
    assert orders == list(range(len(orders)))
    for node in trace.nodes():
        inside = [r.order for child in node.children for n in child.walk() for r in n.tensors]
        for record in node.inputs():
            assert all(record.order < o for o in inside)
        for record in node.outputs():
            assert all(record.order > o for o in inside)
        starts = [child.enter_order for child in node.children]
        assert starts == sorted(starts)
    nodes = trace.nodes()
    first, last = trace.records()[0], trace.records()[-1]
    assert first[0] is nodes[0] and first[1].slot.startswith("inputs")
    assert last[0].relative_path in ("", "norm", "head")  # the root's outputs, or the last leaf's in a pruned tree
    assert last[1].slot.startswith("outputs")
    layer0 = _node(trace, f"{trace.model_name}.layers.0") if name != "shared" else None
    if layer0 is not None:
        layer1 = _node(trace, f"{trace.model_name}.layers.1")
        assert max(r.order for n in layer0.walk() for r in n.tensors) < min(
            r.order for n in layer1.walk() for r in n.tensors)


def test_standard_trace_repeated_calls_use_statistics_for_overwritten_payloads(traces: TraceStore) -> None:
    trace = load_trace(traces("shared-hf"))
    calls = [n for n in trace.nodes() if n.relative_path == "shared"]
    assert [n.call_index for n in calls] == [0, 1, 2]  # numbered in call order by the reader
    assert len({n.outputs()[0].payload for n in calls}) == 1  # transformers wrote one file, three times
    for node in calls[:2]:
        for record in node.tensors:
            assert not record.has_payload
            assert record.stale_reason == "payload overwritten by a later call of the same module (standard trace)"
    assert all(record.has_payload and record.stale_reason is None for record in calls[2].tensors)
    # the file holds the last call's data
    assert torch.equal(trace.load(calls[2].outputs()[0]), load_trace(traces("shared")).load(
        [n for n in load_trace(traces("shared")).nodes() if n.relative_path == "shared"][2].outputs()[0]))


def test_standard_trace_nested_calls_keep_the_last_writer(traces: TraceStore) -> None:
    """A module calling itself: the innermost call wrote its inputs last, so only it keeps a payload."""
    standard, native = load_trace(traces("nested-hf")), load_trace(traces("nested"))
    fresh = {(n.relative_path, n.call_index, r.slot) for n, r in standard.records() if r.has_payload}
    assert fresh == {("", 0, "inputs.args.0"), ("inner", 2, "inputs.args.0"), ("inner.step", 2, "inputs.args.0"),
                     ("inner.step", 2, "outputs")}
    for path, call, slot in fresh:
        ours = next(r for n, r in standard.records() if (n.relative_path, n.call_index, r.slot) == (path, call, slot))
        theirs = next(r for n, r in native.records() if (n.relative_path, n.call_index, r.slot) == (path, call, slot))
        assert torch.equal(standard.load(ours), native.load(theirs))
    result = tracediff.align(traces("nested-hf"), traces("nested"))
    assert result.passed and sum(row.approximate for row in result.rows) == 6


def test_tracediff_trace_shares_payloads_without_marking_them_stale(traces: TraceStore) -> None:
    trace = load_trace(traces("shared"))
    by_payload: dict[str, int] = {}
    for _, record in trace.records():
        by_payload[record.payload] = by_payload.get(record.payload, 0) + 1
        assert record.stale_reason is None
    assert max(by_payload.values()) > 1  # an output reused as the next call's input points to one file


# --- paths from the JSON ------------------------------------------------------------------------------------


def _point_head_output_at(folder: Path, value: str) -> None:
    def edit(tree: dict) -> None:
        json_node(tree, "RefModel.head")["outputs"]["value"] = value

    edit_json(folder, edit)


@pytest.mark.parametrize("value, why", [
    ("/etc/passwd", "is absolute"),
    ("../x.safetensors", "leaves the trace directory"),
    ("./sub/../../x.safetensors", "leaves the trace directory"),
])
def test_paths_outside_the_trace_are_refused_unread(traces: TraceStore, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch, value: str, why: str) -> None:
    folder = copy_trace(traces("ref-hf"), tmp_path / "edited")
    (tmp_path / "x.safetensors").write_bytes((folder / "RefModel.head_outputs.safetensors").read_bytes())
    _point_head_output_at(folder, value)
    trace = load_trace(folder)
    record = _node(trace, "RefModel.head").outputs()[0]
    monkeypatch.setattr(safetensors, "safe_open", _never_open)
    with pytest.raises(UnsafePathError) as e:
        trace.load(record)
    assert str(e.value) == f"{folder}: tensor path {value!r} {why}; refused"


def test_symlink_leading_outside_is_refused_unread(traces: TraceStore, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    folder = copy_trace(traces("ref-hf"), tmp_path / "linked")
    outside = tmp_path / "outside.safetensors"
    payload = folder / "RefModel.head_outputs.safetensors"
    outside.write_bytes(payload.read_bytes())
    payload.unlink()
    payload.symlink_to(outside)
    trace = load_trace(folder)
    monkeypatch.setattr(safetensors, "safe_open", _never_open)
    with pytest.raises(UnsafePathError) as e:
        trace.load(_node(trace, "RefModel.head").outputs()[0])
    assert str(e.value) == (f"{folder}: tensor path './RefModel.head_outputs.safetensors' "
                            "links outside the trace directory; refused")


def test_symlink_inside_the_trace_is_followed(traces: TraceStore, tmp_path: Path) -> None:
    folder = copy_trace(traces("ref-hf"), tmp_path / "inner-link")
    payload = folder / "RefModel.head_outputs.safetensors"
    (folder / "store").mkdir()
    payload.rename(folder / "store" / payload.name)
    payload.symlink_to(folder / "store" / payload.name)
    trace = load_trace(folder)
    assert trace.load(_node(trace, "RefModel.head").outputs()[0]).shape == (3, 2)


def _never_open(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"a refused path was opened: {args}")


# --- bad input ----------------------------------------------------------------------------------------------


def test_bad_traces_raise_one_line_errors(traces: TraceStore, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(TraceFormatError) as e:
        load_trace(missing)
    assert str(e.value) == f"{missing}: no such trace folder or file"

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceFormatError) as e:
        load_trace(empty)
    assert str(e.value) == (f"{empty}: no *_debug_tree_FULL_TENSORS.json or *_debug_tree_SUMMARY.json found")

    folder = copy_trace(traces("ref-hf"), tmp_path / "child")

    def break_child(tree: dict) -> None:
        tree["children"][1] = ["not", "a", "node"]

    path = edit_json(folder, break_child)
    with pytest.raises(TraceFormatError) as e:
        load_trace(folder)
    assert str(e.value) == f"{path}: a child of RefModel is not a node (no 'module_path')"


def test_per_rank_folders_are_suggested(traces: TraceStore, tmp_path: Path) -> None:
    copy_trace(traces("ref"), tmp_path / "dist" / "rank0")
    copy_trace(traces("ref"), tmp_path / "dist" / "rank1")
    with pytest.raises(TraceFormatError) as e:
        load_trace(tmp_path / "dist")
    assert str(e.value).endswith(f"found; it has per-rank traces, e.g. {tmp_path / 'dist' / 'rank0'}")
    assert load_trace(tmp_path / "dist" / "rank1").model_name == "RefModel"


# --- parsing transformers' strings --------------------------------------------------------------------------


@pytest.mark.parametrize("text, shape", [
    ("torch.Size([1, 7, 32])", (1, 7, 32)),
    ("torch.Size([])", ()),
    ("torch.Size([0, 3])", (0, 3)),
    ("something else", None),
])
def test_parse_shape(text: str, shape: tuple[int, ...] | None) -> None:
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text, value", [
    ("tensor(1.2300e-03)", 1.23e-3),
    ("tensor(-4.5000e+02, dtype=torch.bfloat16)", -450.0),
    ("tensor(0.)", 0.0),
    ("tensor(inf)", float("inf")),
    ("tensor(-inf, dtype=torch.float16)", float("-inf")),
    ("None", None),
    (3.0, None),
])
def test_parse_scalar(text: object, value: float | None) -> None:
    assert parse_scalar(text) == value


def test_parse_scalar_nan() -> None:
    value = parse_scalar("tensor(nan, dtype=torch.bfloat16)")
    assert value is not None and value != value


def test_root_class_name_is_not_part_of_the_key(traces: TraceStore) -> None:
    a, b = load_trace(traces("ref")), load_trace(traces("port"))
    assert [n.key for n in a.nodes()] == [n.key for n in b.nodes()]
    assert {n.relative_path for n in a.nodes()} >= {"", "embed", "layers.0.fc1", "head"}
    assert a.model_name == "RefModel" and b.model_name == "PortModel"


def test_subsequent_top_level_calls_are_later_roots(traces: TraceStore, tmp_path: Path) -> None:
    model = ref_model()
    with tracediff.capture(model, tmp_path / "twice"):
        model(toy_input())
        model(toy_input(rows=2))
    trace = load_trace(tmp_path / "twice")
    assert [(r.module_path, r.call_index) for r in trace.roots] == [("RefModel", 0), ("RefModel", 1)]
    assert trace.roots[1].inputs()[0].shape == (2, 4)
    assert json.loads(trace_json_path(tmp_path / "twice").read_text())["subsequent_calls"]
