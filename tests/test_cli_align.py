"""``tracediff align A B``: the contract scripts depend on (exit codes, JSON fields, one-line errors)."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.alignment.helpers import (
    RENAME_RULES,
    TraceStore,
    copy_trace,
    edit_json,
    json_node,
    run_cli,
    trace_json_path,
    trace_store,
)
from tracediff import align, load_trace

HEADER_LINES = 3  # "A: ...", "B: ...", "matched ..."


@pytest.fixture(scope="session")
def traces(tmp_path_factory: pytest.TempPathFactory) -> TraceStore:
    return trace_store(tmp_path_factory)


def _no_nan(text: str) -> Any:
    raise ValueError(f"not strict JSON: {text}")


def strict_json(text: str) -> Any:
    return json.loads(text, parse_constant=_no_nan)


def _align(traces: TraceStore, a: str, b: str, capsys: Any, *extra: str) -> tuple[int, str, str]:
    return run_cli(["align", str(traces(a)), str(traces(b)), *extra], capsys)


# --- exit codes and the table -------------------------------------------------------------------------------


def test_identical_traces_exit_0(traces: TraceStore, capsys: Any) -> None:
    code, out, err = _align(traces, "llama", "llama-hf", capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"A: {traces('llama')} (LlamaModel)"
    assert lines[1] == f"B: {traces('llama-hf')} (LlamaModel)"
    assert lines[2].startswith("matched 30 module calls by name; compared ")
    assert lines[3] == "PASSED: every compared tensor is within tolerance"


def test_divergence_exits_1_and_highlights_the_first(traces: TraceStore, capsys: Any) -> None:
    code, out, err = _align(traces, "llama", "llama-up-bug", capsys)
    assert (code, err) == (1, "")
    result = align(traces("llama"), traces("llama-up-bug"))
    first = result.first_divergence
    lines = out.splitlines()
    assert lines[HEADER_LINES] == f"FIRST DIVERGENCE (introduced): {first.describe()}"
    marked = [line for line in lines if line.startswith(">>")]
    assert len(marked) == 1
    assert marked[0].split()[1:4] == [str(first.order), "LlamaModel.layers.1.mlp.up_proj", "outputs"]
    rows = _table_rows(out)
    assert [int(r.split()[0]) for r in rows] == list(range(first.order - 5, first.order + 6))
    assert lines[-1] == f"(11 of {len(result.rows)} rows shown; --all shows every row)"


def _table_rows(out: str) -> list[str]:
    """The table's body lines, without the '>>' marker."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#"))
    body = []
    for line in lines[start + 2:]:
        if not line.strip() or line.startswith("("):
            break
        body.append(line.removeprefix(">>").strip())
    return body


def test_all_shows_every_row(traces: TraceStore, capsys: Any) -> None:
    code, out, _ = _align(traces, "llama", "llama-up-bug", capsys, "--all")
    assert code == 1
    rows = _table_rows(out)
    assert [int(r.split()[0]) for r in rows] == list(range(len(align(traces("llama"), traces("llama-up-bug")).rows)))
    assert "rows shown" not in out


# --- JSON ---------------------------------------------------------------------------------------------------


def test_json_report(traces: TraceStore, capsys: Any) -> None:
    code, out, _ = _align(traces, "llama", "llama-up-bug", capsys, "--format", "json")
    assert code == 1
    report = strict_json(out)
    assert report["format_version"] == 1 and report["passed"] is False
    first = report["first_divergence"]
    assert first["module_path_a"] == first["module_path_b"] == "LlamaModel.layers.1.mlp.up_proj"
    assert (first["call_index"], first["tensor"], first["origin"]) == (0, "outputs", "introduced")
    assert first["max_abs_err"] > 0 and first["max_rel_err"] > 0
    assert first["amplification"] == "inf"  # strict JSON: infinities are strings
    assert len(report["rows"]) == len(align(traces("llama"), traces("llama-up-bug")).rows)
    assert report["rows"][first["order"]] == first
    assert report["unmatched_a"] == [] and report["unmatched_b"] == []


def test_json_passing(traces: TraceStore, capsys: Any) -> None:
    code, out, _ = _align(traces, "ref", "port", capsys, "--format", "json")
    report = strict_json(out)
    assert code == 0 and report["passed"] is True and report["first_divergence"] is None
    assert report["rows"][0]["module_path_a"] == "RefModel" and report["rows"][0]["module_path_b"] == "PortModel"
    assert report["rows"][1]["module_path_b"] == "PortModel.embed"  # full paths, root class name included


@pytest.mark.parametrize("b", ["nan", "wider"])
def test_json_is_strict_with_nan_and_infinity(traces: TraceStore, capsys: Any, b: str) -> None:
    code, out, _ = _align(traces, "ref", b, capsys, "--format", "json")
    assert code == 1
    report = strict_json(out)
    first = report["first_divergence"]
    if b == "nan":
        assert first["nan_mismatch"] == 1 and first["required_atol"] == "inf"
    else:
        assert first["status"] == "shape_mismatch" and first["max_abs_err"] is None  # NaN becomes null


def test_json_lists_unmatched(traces: TraceStore, capsys: Any) -> None:
    code, out, _ = _align(traces, "ref", "extra", capsys, "--format", "json")
    report = strict_json(out)
    assert code == 0
    assert report["unmatched_a"] == []
    assert report["unmatched_b"] == [{"module_path": "WithExtra.extra", "call_index": 0, "tensor": None}]


def test_json_repeated_call(traces: TraceStore, capsys: Any) -> None:
    _, out, _ = _align(traces, "shared", "shared-bug1", capsys, "--format", "json")
    first = strict_json(out)["first_divergence"]
    assert (first["module_path_b"], first["call_index"], first["tensor"]) == ("SharedThrice.shared", 1, "outputs")


# --- other formats and --output -----------------------------------------------------------------------------


def test_csv(traces: TraceStore, capsys: Any) -> None:
    code, out, _ = _align(traces, "llama", "llama-up-bug", capsys, "--format", "csv")
    assert code == 1
    rows = list(csv.DictReader(io.StringIO(out)))
    result = align(traces("llama"), traces("llama-up-bug"))
    assert list(rows[0]) == list(result.table.columns)
    assert len(rows) == len(result.rows)
    first = rows[result.first_divergence.order]
    assert (first["module_path_b"], first["status"], first["origin"]) == (
        "LlamaModel.layers.1.mlp.up_proj", "diverged", "introduced")


def test_markdown(traces: TraceStore, capsys: Any) -> None:
    code, out, _ = _align(traces, "llama", "llama-up-bug", capsys, "--format", "markdown")
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == f"- A: {traces('llama')} (LlamaModel)"
    marked = [line for line in lines if line.startswith("| >>")]
    assert len(marked) == 1 and "LlamaModel.layers.1.mlp.up_proj" in marked[0]


@pytest.mark.parametrize("fmt", ["table", "json", "csv", "markdown"])
def test_output_writes_the_same_text_atomically(traces: TraceStore, capsys: Any, tmp_path: Path, fmt: str) -> None:
    _, printed, _ = _align(traces, "ref", "port-fc2-bug", capsys, "--format", fmt)
    target = tmp_path / f"report.{fmt}"
    code, out, err = _align(traces, "ref", "port-fc2-bug", capsys, "--format", fmt, "--output", str(target))
    assert (code, out, err) == (1, "", "")
    assert target.read_text() == printed
    assert os.listdir(tmp_path) == [target.name]  # no temporary file left behind


@pytest.mark.parametrize("option", ["--output", "--suggest-map"])
def test_output_into_a_missing_folder(traces: TraceStore, capsys: Any, tmp_path: Path, option: str) -> None:
    target = tmp_path / "no" / "such" / "report.txt"
    code, out, err = _align(traces, "ref", "port", capsys, option, str(target))
    _assert_bad_input(code, out, err, f"tracediff align: error: {target}: could not write: No such file or directory")


# --- names and tolerances -----------------------------------------------------------------------------------


def test_map_file(traces: TraceStore, capsys: Any, tmp_path: Path) -> None:
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"rename": RENAME_RULES}))
    code, out, err = _align(traces, "ref", "renamed-bug", capsys, "--map", str(path), "--format", "json")
    report = strict_json(out)
    assert (code, err) == (1, "")
    assert report["matching"] == "by name"
    first = report["first_divergence"]
    assert (first["module_path_a"], first["module_path_b"]) == ("RefModel.layers.1.fc1", "RenamedPort.blocks.1.up")


def test_suggest_map_round_trip(traces: TraceStore, capsys: Any, tmp_path: Path) -> None:
    path = tmp_path / "suggested.json"
    code, out, err = _align(traces, "ref", "renamed", capsys, "--suggest-map", str(path))
    assert code == 0
    assert err == ("tracediff align: warning: module paths did not line up; nodes were matched by structure "
                   "(values, sizes and call order). Check the suggested rename map.\n")
    assert f"matched {len(load_trace(traces('renamed')).nodes())} module calls by structure" in out
    rules = json.loads(path.read_text())["rename"]
    assert rules == [list(rule) for rule in align(traces("ref"), traces("renamed")).suggested_rename]
    code, out, err = _align(traces, "ref", "renamed", capsys, "--map", str(path), "--format", "json")
    report = strict_json(out)
    assert (code, err) == (0, "") and report["matching"] == "by name"
    assert report["unmatched_a"] == report["unmatched_b"] == []


def test_suggest_map_when_names_line_up(traces: TraceStore, capsys: Any, tmp_path: Path) -> None:
    path = tmp_path / "suggested.json"
    code, _, err = _align(traces, "ref", "port", capsys, "--suggest-map", str(path))
    assert code == 0
    assert err == f"tracediff align: module paths lined up by name; {path} has no rules\n"
    assert json.loads(path.read_text()) == {"rename": []}


def test_per_pattern_tolerances(traces: TraceStore, capsys: Any) -> None:
    code, out, err = _align(traces, "llama", "llama-up-bug", capsys, "--atol", "1e-5", "--atol", "layers.*.mlp=1",
                            "--rtol", "layers.*.mlp=10", "--format", "json")
    report = strict_json(out)
    assert (code, err) == (1, "")
    first = report["first_divergence"]
    assert (first["module_path_b"], first["tensor"]) == ("LlamaModel.layers.1", "outputs")
    assert {r["atol"] for r in report["rows"] if ".mlp" in r["module_path_b"]} == {1.0}
    assert {r["atol"] for r in report["rows"] if ".mlp" not in r["module_path_b"]} == {1e-5}


def test_loose_tolerances_pass(traces: TraceStore, capsys: Any) -> None:
    code, _, _ = _align(traces, "llama", "llama-up-bug", capsys, "--atol", "1", "--rtol", "1")
    assert code == 0


def test_unused_pattern_warning(traces: TraceStore, capsys: Any) -> None:
    code, out, err = _align(traces, "llama", "llama", capsys, "--atol", "layers.*.mpl=1e-4", "--format", "json")
    assert code == 0
    assert err == ("tracediff align: warning: --atol pattern 'layers.*.mpl' matches no module; "
                   "did you mean layers.1.mlp, layers.0.mlp, layers.1?\n")
    assert strict_json(out)["warnings"] == [err.removeprefix("tracediff align: warning: ").rstrip("\n")]


# --- statistics-only traces ---------------------------------------------------------------------------------


def test_summary_only_rows_are_marked(traces: TraceStore, capsys: Any) -> None:
    code, out, _ = _align(traces, "llama-hf-repr", "llama-hf-repr-up-bug", capsys)
    assert code == 1
    assert "from statistics only)" in out.splitlines()[2]
    assert "(approximate, from statistics)" in out.splitlines()[HEADER_LINES]
    assert "diverged (stats)" in out


# --- bad input: one line on stderr, exit 2 ------------------------------------------------------------------


def _assert_bad_input(code: int, out: str, err: str, message: str) -> None:
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err == message + "\n"


def _broken_copy(traces: TraceStore, tmp_path: Path, text: str) -> tuple[Path, Path]:
    folder = copy_trace(traces("ref"), tmp_path / "broken")
    path = trace_json_path(folder)
    path.write_text(text(path.read_text()) if callable(text) else text)
    return folder, path


def test_invalid_json(traces: TraceStore, capsys: Any, tmp_path: Path) -> None:
    folder, path = _broken_copy(traces, tmp_path, "{not json")
    code, out, err = run_cli(["align", str(traces("ref")), str(folder)], capsys)
    _assert_bad_input(code, out, err, f"tracediff align: error: {path}: invalid JSON at line 1 column 2 "
                                      "(Expecting property name enclosed in double quotes); the file may be truncated")


def test_truncated_json(traces: TraceStore, capsys: Any, tmp_path: Path) -> None:
    folder, path = _broken_copy(traces, tmp_path, lambda text: text[: len(text) // 2])
    with pytest.raises(json.JSONDecodeError) as e:
        json.loads(path.read_text())
    code, out, err = run_cli(["align", str(traces("ref")), str(folder)], capsys)
    _assert_bad_input(code, out, err, f"tracediff align: error: {path}: invalid JSON at line {e.value.lineno} column "
                                      f"{e.value.colno} ({e.value.msg}); the file may be truncated")


@pytest.mark.parametrize("text", ["[1, 2, 3]", '{"inputs": {}}', '"LlamaModel"'])
def test_json_that_is_not_a_trace(traces: TraceStore, capsys: Any, tmp_path: Path, text: str) -> None:
    folder, path = _broken_copy(traces, tmp_path, text)
    code, out, err = run_cli(["align", str(traces("ref")), str(folder)], capsys)
    _assert_bad_input(code, out, err, f"tracediff align: error: {path}: not a trace: expected a JSON object with "
                                      "a 'module_path' at the top")


def test_a_file_that_is_not_text(traces: TraceStore, capsys: Any, tmp_path: Path) -> None:
    path = tmp_path / "Model_debug_tree_FULL_TENSORS.json"
    path.write_bytes(b"\xff\xfe\x00binary")
    code, out, err = run_cli(["align", str(traces("ref")), str(path)], capsys)
    _assert_bad_input(code, out, err, f"tracediff align: error: {path}: not UTF-8 text, so not a trace JSON")


def test_nonexistent_folder(traces: TraceStore, capsys: Any, tmp_path: Path) -> None:
    code, out, err = run_cli(["align", str(tmp_path / "nope"), str(traces("ref"))], capsys)
    _assert_bad_input(code, out, err, f"tracediff align: error: {tmp_path / 'nope'}: no such trace folder or file")


def test_folder_without_a_trace(traces: TraceStore, capsys: Any, tmp_path: Path) -> None:
    code, out, err = run_cli(["align", str(traces("ref")), str(tmp_path)], capsys)
    _assert_bad_input(code, out, err, f"tracediff align: error: {tmp_path}: no *_debug_tree_FULL_TENSORS.json or "
                                      "*_debug_tree_SUMMARY.json found")


@pytest.mark.parametrize("text, message", [
    ("{oops", "{path}: not a JSON rename map (Expecting property name enclosed in double quotes: line 1 column 2 "
              "(char 1))"),
    ('{"rename": {"a": "b"}}', '{path}: expected {{"rename": [[regex, replacement], ...]}}'),
    ('{"rename": [["(", "x"]]}', "{path}: rule 0 regex '(' does not compile (missing ), unterminated subpattern "
                                 "at position 0)"),
    (None, "{path}: rename map not found"),
])
def test_bad_map_file(traces: TraceStore, capsys: Any, tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "map.json"
    if text is not None:
        path.write_text(text)
    code, out, err = _align(traces, "ref", "renamed", capsys, "--map", str(path))
    _assert_bad_input(code, out, err, "tracediff align: error: " + message.format(path=path))


@pytest.mark.parametrize("args, message", [
    (["--atol", "abc"], "--atol 'abc': expected a number or PATTERN=NUMBER"),
    (["--rtol", "layers.*=x"], "--rtol 'layers.*=x': expected a number or PATTERN=NUMBER"),
    (["--atol", "=1e-3"], "--atol '=1e-3': the pattern before '=' is empty"),
    (["--atol", "-1"], "atol for '*' is -1.0: tolerances must be >= 0"),
    (["--atol", "nan"], "atol for '*' is nan: tolerances must be >= 0"),
])
def test_bad_tolerance(traces: TraceStore, capsys: Any, args: list[str], message: str) -> None:
    code, out, err = _align(traces, "ref", "port", capsys, *args)
    _assert_bad_input(code, out, err, f"tracediff align: error: {message}")


@pytest.mark.parametrize("args, message", [
    (["--format", "xml"], "tracediff align: error: argument --format: invalid choice: 'xml' (choose from table, "
                          "json, csv, markdown, html) (see --help)"),
    ([], "tracediff align: error: the following arguments are required: B (see --help)"),
])
def test_usage_errors(traces: TraceStore, capsys: Any, args: list[str], message: str) -> None:
    extra = [] if not args else [str(traces("port"))]
    code, out, err = run_cli(["align", str(traces("ref")), *extra, *args], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.replace("'table', 'json', 'csv', 'markdown', 'html'", "table, json, csv, markdown, html") == \
        message + "\n"


# --- unreadable payloads: a row, and the rest of the report -------------------------------------------------


def _damaged(traces: TraceStore, tmp_path: Path, how: str) -> tuple[Path, str]:
    folder = copy_trace(traces("ref-hf"), tmp_path / how)
    payload = folder / "RefModel.head_outputs.safetensors"
    real = f"{folder.resolve()}/RefModel.head_outputs.safetensors"
    if how == "missing":
        payload.unlink()
        return folder, f"{real}: payload file is missing"
    if how == "truncated":
        payload.write_bytes(payload.read_bytes()[:-5])
        return folder, f"{real}: not a readable safetensors file ("
    if how == "corrupt":
        payload.write_bytes(b"\xff" * 8 + b"{" * 40)
        return folder, f"{real}: not a readable safetensors file ("
    if how == "symlink":
        outside = tmp_path / "outside.safetensors"
        payload.rename(outside)
        payload.symlink_to(outside)
        return folder, (f"{folder}: tensor path './RefModel.head_outputs.safetensors' links outside the trace "
                        "directory; refused")
    value = {"absolute": "/etc/passwd", "dotdot": "../x.safetensors"}[how]
    (tmp_path / "x.safetensors").write_bytes(payload.read_bytes())

    def point(tree: dict) -> None:
        json_node(tree, "RefModel.head")["outputs"]["value"] = value

    edit_json(folder, point)
    why = "is absolute" if how == "absolute" else "leaves the trace directory"
    return folder, f"{folder}: tensor path {value!r} {why}; refused"


@pytest.mark.parametrize("how", ["missing", "truncated", "corrupt", "symlink", "absolute", "dotdot"])
def test_unreadable_payload_is_a_row(traces: TraceStore, capsys: Any, tmp_path: Path, how: str) -> None:
    folder, reason = _damaged(traces, tmp_path, how)
    code, out, err = run_cli(["align", str(traces("ref-hf")), str(folder), "--format", "json"], capsys)
    assert (code, err) == (1, "")
    report = strict_json(out)
    assert report["passed"] is False and report["first_divergence"] is None
    (row,) = [r for r in report["rows"] if r["status"] != "identical"]
    assert (row["module_path_b"], row["tensor"], row["status"]) == ("RefModel.head", "outputs", "unreadable")
    assert row["reason"].startswith(reason) if reason.endswith("(") else row["reason"] == reason
    assert len(report["rows"]) == len(align(traces("ref-hf"), traces("ref-hf")).rows)


def test_unreadable_payload_in_the_table(traces: TraceStore, capsys: Any, tmp_path: Path) -> None:
    folder, _ = _damaged(traces, tmp_path, "missing")
    code, out, _ = run_cli(["align", str(traces("ref-hf")), str(folder)], capsys)
    assert code == 1
    assert out.splitlines()[HEADER_LINES] == "NOT PASSED: 1 tensor(s) could not be read"
    assert any("unreadable" in line and "RefModel.head" in line for line in out.splitlines())


def test_help_has_an_example(capsys: Any) -> None:
    code, out, _ = run_cli(["align", "--help"], capsys)
    assert code == 0
    assert "tracediff align traces/orig traces/port" in out and "exit codes:\n  0  " in out
