"""Crafted trace folders: every file read is confined, a regular file, bounded; every bad field is one line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import tracediff
from tests.safety.helpers import cli, copy, edit_tree, tree_file
from tracediff.errors import TraceFormatError


def _one_line_error(code: int, err: str, command: str, expected: str) -> None:
    assert code == 2 and err == f"tracediff {command}: error: {expected}\n", err


@pytest.fixture
def b(small_trace: Path, tmp_path: Path) -> Path:
    return copy(small_trace, tmp_path / "b")


def _payload_entries(tree: Any) -> list[dict[str, Any]]:
    found, stack = [], [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("value"), str) and "shape" in item:
                found.append(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


# --- files that are not what they claim ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["outside", "zero", "fifo", "directory"])
def test_trace_and_metadata_files_must_be_regular_files_inside_the_folder(
        kind: str, b: Path, tmp_path: Path, small_trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, what in ((tree_file(b).name, "trace JSON"), ("tracediff_metadata.json", "metadata")):
        work = copy(b, tmp_path / f"{kind}-{what.replace(' ', '-')}")
        target = work / name
        outside = tmp_path / "elsewhere.json"
        outside.write_text(target.read_text())
        target.unlink()
        if kind == "outside":
            target.symlink_to(outside)
        elif kind == "zero":
            target.symlink_to("/dev/zero")
        elif kind == "fifo":
            os.mkfifo(target)
        else:
            target.mkdir()
        code, _, err = cli(["show", str(work)], capsys)
        if kind in ("outside", "zero"):
            _one_line_error(code, err, "show", f"{target}: links outside {work}; refused")
        else:
            label = "a FIFO" if kind == "fifo" else "a directory"
            _one_line_error(code, err, "show", f"{target}: the {what} is {label}, not a regular file; refused")


def test_files_over_their_size_bound_are_refused(b: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import tracediff.trace.reading as reading

    monkeypatch.setattr(reading, "SMALL_JSON_LIMIT", 100)
    size = (b / "tracediff_metadata.json").stat().st_size
    code, _, err = cli(["show", str(b)], capsys)
    _one_line_error(code, err, "show", f"{b / 'tracediff_metadata.json'}: the metadata is {size:,} bytes, over the "
                                       "limit of 100; refused")


@pytest.mark.parametrize("text,problem", [
    ("[" * 100_000 + "]" * 100_000, "nests JSON too deeply to be read; refused"),
    ('{"module_path": "M", "call_index": ' + "9" * 5000 + "}", "holds a value that cannot be read (Exceeds the "),
])
def test_deep_nesting_and_huge_integers_are_one_line(text: str, problem: str, b: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    for name in (tree_file(b).name, "tracediff_metadata.json"):
        original = (b / name).read_text()
        (b / name).write_text(text)
        code, _, err = cli(["show", str(b)], capsys)
        assert code == 2 and err.startswith(f"tracediff show: error: {b / name}: the ") and problem in err, err
        assert err.count("\n") == 1
        (b / name).write_text(original)


def test_a_rename_map_nested_too_deeply_is_one_line(b: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rename = tmp_path / "map.json"
    rename.write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = cli(["align", str(b), str(b), "--map", str(rename)], capsys)
    assert code == 2 and err.startswith(f"tracediff align: error: {rename}: not a JSON rename map (")


# --- payloads ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reference,reason", [
    (".", "names the trace directory itself, not a file"),
    ("./", "names the trace directory itself, not a file"),
    ("a\0b.safetensors", "holds a NUL byte or an unencodable character; refused"),
    ("\udc80.safetensors", "holds a NUL byte or an unencodable character; refused"),
    ("loop.safetensors", "cannot be resolved"),
    ("fifo.safetensors", "the payload is a FIFO, not a regular file; refused"),
    ("dir.safetensors", "the payload is a directory, not a regular file; refused"),
])
def test_a_bad_payload_is_one_unreadable_row_and_the_report_goes_on(
        reference: str, reason: str, b: Path, small_trace: Path) -> None:
    (b / "loop.safetensors").symlink_to("loop.safetensors")
    os.mkfifo(b / "fifo.safetensors")
    (b / "dir.safetensors").mkdir()

    def point_first_payload_at(tree: dict[str, Any]) -> None:
        _payload_entries(tree)[0]["value"] = reference

    edit_tree(b, point_first_payload_at)
    result = tracediff.align(small_trace, b)
    unreadable = result.unreadable
    assert len(unreadable) >= 1 and all(reason in row.reason for row in unreadable), [r.reason for r in unreadable]
    assert len(result.rows) > len(unreadable) and not result.passed


def test_payload_links_are_followed_inside_the_folder_only_and_never_after_resolution(
        b: Path, small_trace: Path, tmp_path: Path) -> None:
    """A payload that is a link resolves to its target inside the folder, a link out is refused, and a
    file swapped for a link after its name was resolved is refused when read (``O_NOFOLLOW``)."""
    from tracediff.errors import PayloadError, UnsafePathError
    from tracediff.trace.load import load_trace

    records = {r.payload: r for _, r in load_trace(b).records() if r.payload}
    inside, out, swapped = sorted(records)[:3]
    (b / "kept.bin").write_bytes((b / inside).read_bytes())
    (b / inside).unlink()
    (b / inside).symlink_to("kept.bin")
    (tmp_path / "elsewhere.safetensors").write_bytes((b / out).read_bytes())
    (b / out).unlink()
    (b / out).symlink_to(tmp_path / "elsewhere.safetensors")
    trace = load_trace(b)
    assert trace.payload_path(records[inside]) == (b / "kept.bin").resolve()
    assert trace.load_payload(records[inside]).values.size > 0
    with pytest.raises(UnsafePathError, match="links outside"):
        trace.payload_path(records[out])
    assert trace.payload_path(records[swapped]) == (b / swapped).resolve()
    (b / "moved.bin").write_bytes((b / swapped).read_bytes())
    (b / swapped).unlink()
    (b / swapped).symlink_to("moved.bin")
    with pytest.raises(PayloadError, match="cannot open the payload"):
        trace.load_payload(records[swapped])


def test_a_value_that_is_not_a_path_is_said_in_the_row(b: Path, small_trace: Path) -> None:
    def number_value(tree: dict[str, Any]) -> None:
        _payload_entries(tree)[0]["value"] = 7

    edit_tree(b, number_value)
    result = tracediff.align(small_trace, b)
    assert any("the trace's 'value' is a number, not a payload path; compared on its recorded statistics"
               in row.reason for row in result.rows)


def test_a_payload_whose_dtype_differs_from_the_trace_is_said_in_the_row(b: Path, small_trace: Path) -> None:
    import torch

    from tracediff.files.payloads import write_tensor_file

    entry = _payload_entries(json.loads(tree_file(b).read_text()))[0]
    payload = b / entry["value"]
    tensor = tracediff.load_trace(b).load(next(r for _, r in tracediff.load_trace(b).records()
                                                if r.payload == entry["value"]))
    write_tensor_file(payload, tensor.to(torch.float64))
    result = tracediff.align(small_trace, b)
    assert any("B's payload holds torch.float64 but the trace says torch.float32" in row.reason
               for row in result.rows)


def test_a_payload_whose_shape_differs_from_the_trace_is_said_in_the_row(b: Path, small_trace: Path) -> None:
    """A replaced payload of the same values with one more dim of size 1: still compared (the values line up
    with A's), never silently: the row says what the payload holds."""
    from tracediff.files.payloads import write_tensor_file

    entry = _payload_entries(json.loads(tree_file(b).read_text()))[0]
    trace = tracediff.load_trace(b)
    tensor = trace.load(next(r for _, r in trace.records() if r.payload == entry["value"]))
    write_tensor_file(b / entry["value"], tensor.unsqueeze(0).clone())
    result = tracediff.align(small_trace, b)
    shape = list(tensor.shape)
    assert any(f"B's payload holds shape {[1, *shape]} but the trace says {shape}" in row.reason
               for row in result.rows)


def test_memory_error_while_mapping_a_payload_is_an_unreadable_row(tmp_path: Path, small_trace: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.safety.helpers import capture_small
    from tracediff.files import confine

    other = capture_small(tmp_path / "other", seed=1)  # payloads differ: they must be mapped to be compared

    def no_memory(*_args: Any, **_kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(confine.mmap, "mmap", no_memory)
    result = tracediff.align(small_trace, other)
    assert result.unreadable and all("not enough memory to map the payload" in r.reason for r in result.unreadable)


# --- field types ---------------------------------------------------------------------------------------------


def _set(path: list[Any], value: Any) -> Any:
    def edit(tree: dict[str, Any]) -> None:
        target: Any = tree
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


def _first_stats(tree: dict[str, Any], value: Any) -> None:
    next(e for e in _payload_entries(tree) if "stats" in e)["stats"] = value


@pytest.mark.parametrize("edit,message", [
    (_set(["error"], "it broke"), "'error' is str; expected an object with 'type' and 'message'"),
    (_set(["error"], ["x"]), "'error' is list; expected an object with 'type' and 'message'"),
    (_set(["subsequent_calls"], 3), "subsequent_calls: is int; expected a list of nodes"),
    (_set(["call_index"], "x"), "'call_index' is 'x'; expected a whole number"),
    (_set(["backward"], [{"module_path": "Small", "call_index": "x"}]),
     "backward entry 0 (Small): 'call_index' is 'x'; expected a whole number"),
    (_set(["backward"], [{"module_path": "Small", "call_index": None}]),
     "backward entry 0 (Small): 'call_index' is None; expected a whole number"),
    (_set(["backward"], [{"module_path": "Small", "backward_order": 3}]),
     "backward entry 0 (Small): 'backward_order' is 3; expected [arrival, departure] numbers"),
    (_set(["backward"], [{"module_path": "Small", "backward_order": ["a", 1]}]),
     "'backward_order' is ['a', 1]; expected [arrival, departure] numbers"),
    (lambda t: _first_stats(t, [1, 2]), "tensor 'stats' is list; expected an object of numbers"),
    (lambda t: _first_stats(t, {"mean": 10 ** 400}), "tensor statistic 'mean' is 1000"),
    (lambda t: _first_stats(t, {"nan": float("inf")}), "tensor statistic 'nan' is inf; expected a count"),
])
def test_unchecked_field_types_become_one_line_errors(edit: Any, message: str, b: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    edit_tree(b, edit)
    for command in (["show", str(b)], ["align", str(b), str(b)]):
        code, _, err = cli(command, capsys)
        assert code == 2 and err.startswith(f"tracediff {command[0]}: error: {tree_file(b)}: ") and message in err, err
        assert err.count("\n") == 1


def test_a_huge_shape_dimension_is_refused(b: Path) -> None:
    def huge(tree: dict[str, Any]) -> None:
        _payload_entries(tree)[0]["shape"] = "torch.Size([" + "9" * 5000 + "])"

    edit_tree(b, huge)
    with pytest.raises(TraceFormatError, match="is not a plausible shape"):
        tracediff.load_trace(b)


# --- output escaping -----------------------------------------------------------------------------------------


def test_show_escapes_terminal_sequences_and_lone_surrogates(b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def hostile_names(tree: dict[str, Any]) -> None:
        tree["children"][0]["module_path"] = "Small.\x1b[2J\x1b]0;owned\x07\udc80"

    edit_tree(b, hostile_names)
    code, out, _ = cli(["show", str(b)], capsys)
    assert code == 0 and "\x1b" not in out and "\x07" not in out
    assert "\\x1b[2J\\x1b]0;owned\\x07\\udc80" in out
    out_file = b.parent / "shown.csv"
    assert cli(["show", str(b), "--format", "csv", "-o", str(out_file)], capsys)[0] == 0
    assert "\\udc80" in out_file.read_text(encoding="utf-8")


def test_markdown_escapes_html_from_module_names(b: Path, small_trace: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    def hostile(tree: dict[str, Any]) -> None:
        tree["module_path"] = "<img src=x onerror=alert(1)>"

    edit_tree(b, hostile)
    code, out, _ = cli(["align", str(small_trace), str(b), "--format", "markdown"], capsys)
    assert code in (0, 1) and "<img" not in out and "&lt;img src=x onerror=alert(1)>" in out


def test_a_folder_with_payloads_only_says_what_happened(b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for path in b.glob("*.json"):
        path.unlink()
    code, _, err = cli(["show", str(b)], capsys)
    assert code == 2 and err.endswith("it holds payloads only: the capture that wrote them ended before its trace "
                                      "JSON or journal was written\n")
