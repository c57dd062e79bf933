"""The reader's MUSTs of docs/trace-format.md, each fed a file that breaks it (or stretches it as far as allowed).

The spec's appendix lists every MUST with the test that enforces it; the tests
below are those that did not live elsewhere. Each builds a small trace by hand,
as the spec's section 11 does, so that the file on disk is exactly the case.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import tracediff
from tracediff import format as fmt
from tracediff.cli.main import main
from tracediff.errors import PayloadFormatError

X = torch.arange(8, dtype=torch.float32).reshape(2, 4) / 8


def entry(name: str) -> dict[str, Any]:
    return {"shape": repr(X.shape), "dtype": repr(X.dtype), "value": f"./{name}.safetensors",
            "stats": {"numel": 8}, "device": "cpu"}


def write_trace(folder: Path, *, journal_only: bool = False) -> Path:
    """A tracediff trace of ``M`` calling ``M.proj`` once (the spec's section 11), payloads under ``data``."""
    folder.mkdir(parents=True)
    for name in ("M.proj_outputs", "M_outputs"):
        save_file({fmt.PAYLOAD_KEY: X}, str(folder / f"{name}.safetensors"))
    proj = {"module_path": "M.proj", "module_type": "Linear", "call_index": 0, "inputs": {},
            "outputs": entry("M.proj_outputs")}
    tree = {"module_path": "M", "module_type": "M", "call_index": 0, "inputs": {}, "children": [proj],
            "outputs": entry("M_outputs")}
    metadata = {"format_version": fmt.FORMAT_VERSION, "tracediff_version": "test", "model_name": "M",
                "options": {}, "complete": True}
    (folder / fmt.METADATA_FILE).write_text(json.dumps(metadata))
    if journal_only:
        lines = [{"enter": 0, "parent": None, "module_path": "M", "call_index": 0, "module_type": "M"},
                 {"enter": 1, "parent": 0, "module_path": "M.proj", "call_index": 0, "module_type": "Linear"},
                 {"exit": 1, "node": proj}]
        text = "".join(json.dumps(line) + "\n" for line in lines) + '{"exit": 0, "node": {"module_pa'
        (folder / fmt.JOURNAL_FILE).write_text(text)
        return folder
    (folder / "M_debug_tree_FULL_TENSORS.json").write_text(json.dumps(tree))
    return folder


def edit_tree(folder: Path, edit: Any) -> None:
    path = folder / "M_debug_tree_FULL_TENSORS.json"
    tree = json.loads(path.read_text())
    edit(tree)
    path.write_text(json.dumps(tree))


def rows(result: tracediff.Alignment) -> list[tuple[str, str, str]]:
    return [(row.module_path_b, row.tensor, row.status) for row in result.rows]


# --- section 5: a payload is one tensor under the key "data" ----------------------------------------------


@pytest.mark.parametrize(("tensors", "found"), [
    ({"weight": X}, "'weight'"),
    ({"data": X, "extra": X.clone()}, "'data', 'extra'"),
    ({"a": X, "b": X.clone()}, "'a', 'b'"),
    ({}, "no tensor"),
])
def test_a_payload_under_another_key_exits_2_naming_the_file_and_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], tensors: dict[str, torch.Tensor], found: str) -> None:
    good, bad = write_trace(tmp_path / "good"), write_trace(tmp_path / "bad")
    payload = bad / "M.proj_outputs.safetensors"
    save_file(tensors, str(payload))
    assert main(["align", str(good), str(bad)]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"tracediff align: error: {payload.resolve()}: a payload holds one tensor under the "
                              f"key 'data': expected 'data', found {found}\n")


def test_two_traces_with_the_same_misnamed_payload_do_not_pass_as_identical(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Equal bytes under the wrong key were once taken for an identical pair without reading the header's key."""
    a, b = write_trace(tmp_path / "a"), write_trace(tmp_path / "b")
    for folder in (a, b):
        save_file({"weight": X}, str(folder / "M.proj_outputs.safetensors"))
    assert main(["align", str(a), str(b)]) == 2
    assert "expected 'data', found 'weight'" in capsys.readouterr().err
    with pytest.raises(PayloadFormatError, match=r"expected 'data', found 'weight'$"):
        tracediff.align(a, b)


def test_a_pickled_payload_is_never_unpickled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good, bad = write_trace(tmp_path / "good"), write_trace(tmp_path / "bad")
    torch.save({"data": X}, bad / "M.proj_outputs.safetensors")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a payload was unpickled")

    for module, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")):
        monkeypatch.setattr(module, name, refuse)
    result = tracediff.align(good, bad)
    (row,) = [row for row in result.rows if row.status != "identical"]
    assert (row.module_path_b, row.status) == ("M.proj", "unreadable")
    assert "not a readable safetensors file" in row.reason


# --- sections 1 and 2: what a reader ignores ----------------------------------------------------------------


def test_unknown_keys_are_ignored_at_every_level(tmp_path: Path) -> None:
    plain, extended = write_trace(tmp_path / "plain"), write_trace(tmp_path / "extended")

    def add_unknown_keys(tree: dict[str, Any]) -> None:
        tree["future_root_key"] = {"anything": [1, 2]}
        proj = tree["children"][0]
        proj["future_node_key"] = "x"
        proj["outputs"]["future_entry_key"] = {"nested": True}
        proj["outputs"]["stats"]["future_statistic"] = 1.5

    edit_tree(extended, add_unknown_keys)
    metadata = json.loads((extended / fmt.METADATA_FILE).read_text())
    (extended / fmt.METADATA_FILE).write_text(json.dumps({**metadata, "future_metadata_key": [None]}))
    result = tracediff.align(plain, extended)
    assert result.passed and rows(result) == rows(tracediff.align(plain, plain))
    assert [row.status for row in result.rows] == ["identical", "identical"]


def test_malformed_forward_parameters_are_ignored(tmp_path: Path) -> None:
    plain, odd = write_trace(tmp_path / "plain"), write_trace(tmp_path / "odd")
    metadata = json.loads((odd / fmt.METADATA_FILE).read_text())
    table = {"Linear": "input", "M": [1, "x"], "Other": {"x": 1}, "Fine": ["x", "**kwargs"]}
    (odd / fmt.METADATA_FILE).write_text(json.dumps({**metadata, "forward_parameters": table}))
    trace = tracediff.load_trace(odd)
    assert [trace.forward_parameters(node) for node in trace.nodes()] == [None, None]
    assert fmt.forward_parameters({"forward_parameters": table}) == {"Fine": ("x", "**kwargs")}
    assert fmt.forward_parameters({"forward_parameters": ["x"]}) == {}
    result = tracediff.align(plain, odd)
    assert result.passed and rows(result) == rows(tracediff.align(plain, plain))


def test_files_the_trace_does_not_reference_are_ignored(tmp_path: Path) -> None:
    plain, crowded = write_trace(tmp_path / "plain"), write_trace(tmp_path / "crowded")
    (crowded / "provenance.json").write_text(json.dumps({"versions": {"torch": "0"}}))
    (crowded / "notes.txt").write_text("not part of the trace")
    (crowded / "other.json").write_text("[not json")
    save_file({"data": X + 1}, str(crowded / "M.unreferenced_outputs.safetensors"))
    save_file({"weight": X}, str(crowded / "misnamed_but_unreferenced.safetensors"))
    result = tracediff.align(plain, crowded)
    assert result.passed and rows(result) == rows(tracediff.align(plain, plain))


def test_non_finite_number_tokens_are_accepted(tmp_path: Path) -> None:
    folder = write_trace(tmp_path / "t")
    path = folder / "M_debug_tree_FULL_TENSORS.json"
    text = path.read_text().replace('"stats": {"numel": 8}',
                                    '"stats": {"numel": 8, "mean": NaN, "max": Infinity, "min": -Infinity}', 1)
    path.write_text(text)
    record = next(r for _, r in tracediff.load_trace(folder).records())
    stats = dict(record.stats or {})
    assert stats["max"] == float("inf") and stats["min"] == float("-inf") and stats["mean"] != stats["mean"]


# --- section 5: readers follow "value", never file names ----------------------------------------------------


def test_payload_file_names_carry_no_meaning(tmp_path: Path) -> None:
    plain, renamed = write_trace(tmp_path / "plain"), write_trace(tmp_path / "renamed")
    # swap the two files' names, and point each entry at its tensor's new name
    (renamed / "M.proj_outputs.safetensors").rename(renamed / "tmp.safetensors")
    (renamed / "M_outputs.safetensors").rename(renamed / "M.proj_outputs.safetensors")
    (renamed / "tmp.safetensors").rename(renamed / "M_outputs.safetensors")
    save_file({"data": X * 2}, str(renamed / "M_outputs.safetensors"))  # now M.proj's file: M.proj differs

    def follow(tree: dict[str, Any]) -> None:
        tree["outputs"]["value"] = "./M.proj_outputs.safetensors"
        tree["children"][0]["outputs"]["value"] = "./M_outputs.safetensors"

    edit_tree(renamed, follow)
    result = tracediff.align(plain, renamed)
    assert [(path, status) for path, _, status in rows(result)] == [("M.proj", "diverged"), ("M", "identical")]


# --- section 8: a journal's half-written last line ----------------------------------------------------------


def test_a_journal_line_that_is_not_json_is_skipped_and_the_trace_is_incomplete(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_trace(tmp_path / "died", journal_only=True)
    trace = tracediff.load_trace(folder)
    assert [(n.module_path, n.call_index) for n in trace.nodes()] == [("M", 0), ("M.proj", 0)]
    assert trace.incomplete_reason is not None
    assert main(["align", str(folder), str(folder)]) == 1  # an incomplete trace never passes
    assert "incomplete" in capsys.readouterr().out.lower()


# --- section 9: an op node is not a module call -------------------------------------------------------------


def test_an_op_node_is_not_taken_for_a_module_call(tmp_path: Path) -> None:
    folder = write_trace(tmp_path / "ops")
    shutil.copy(folder / "M.proj_outputs.safetensors", folder / "M.proj_op0_add_outputs.safetensors")

    def add_op(tree: dict[str, Any]) -> None:
        op = {"module_path": "M.proj", "call_index": 0, "op": "torch.add", "op_index": 0, "inputs": {},
              "outputs": entry("M.proj_op0_add_outputs")}
        tree["children"][0]["children"] = [op]

    edit_tree(folder, add_op)
    trace = tracediff.load_trace(folder)
    assert [(n.module_path, n.call_index, n.op) for n in trace.nodes()] == [("M", 0, None), ("M.proj", 0, None)]
    (op,) = [op for n in trace.nodes() for op in n.ops]
    assert (op.module_path, op.op, op.op_index) == ("M.proj", "torch.add", 0)


# --- section 4: a standard SUMMARY file drops every key named "value" -------------------------------------


def test_an_argument_missing_from_a_standard_summary_file_is_not_called_absent(tmp_path: Path) -> None:
    """transformers' SUMMARY drops attention's ``value=``: not compared, never "only in A" or a divergence."""
    from tests.format.test_format import CallsAttention
    from tests.models import seeded, toy_input

    model = seeded(CallsAttention)
    with tracediff.model_addition_debugger_context(model, debug_path=str(tmp_path)):
        model(toy_input())
    (summary,) = tmp_path.glob(f"*{fmt.SUMMARY_SUFFIX}")
    assert "value" not in json.loads(summary.read_text())["children"][0]["inputs"].get("kwargs", {})
    result = tracediff.align(tmp_path, summary)
    assert result.passed and result.argument_diffs == ()
    assert [(u.module_path, u.tensor) for u in result.unmatched_a] == [("CallsAttention.attn", "inputs.kwargs.value")]
    assert all(row.tensor != "inputs.kwargs.value" for row in result.rows)
