"""The trace format module: one owner for every name, the tensor-entry rule, versions, typed values."""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff
from tests.models import seeded, toy_input
from tracediff import format as fmt
from tracediff.errors import TraceFormatError

PACKAGE = Path(tracediff.__file__).parent


class Attention(nn.Module):
    """Takes a keyword argument named ``value``, as attention functions do."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(4, 4)

    def forward(self, query: torch.Tensor, *, value: torch.Tensor, scale: float = 0.5) -> torch.Tensor:
        return torch.softmax(self.q(query) @ value.T * scale, dim=-1) @ value


class CallsAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, value=x * 2)


def _tree(folder: Path, suffix: str) -> dict:
    (path,) = folder.glob(f"*{suffix}")
    return json.loads(path.read_text())


@pytest.mark.parametrize("tensors", ["full", "summary", "repr"])
def test_a_keyword_argument_named_value_stays_in_the_summary_file(tmp_path: Path, tensors: str) -> None:
    """Only a tensor entry's payload is left out of SUMMARY, never an argument that happens to be named value."""
    model = seeded(CallsAttention)
    with tracediff.capture(model, tmp_path, tensors=tensors):
        model(toy_input())
    full, summary = _tree(tmp_path, fmt.FULL_SUFFIX), _tree(tmp_path, fmt.SUMMARY_SUFFIX)
    kept = summary["children"][0]["inputs"]["kwargs"]["value"]
    assert kept["shape"] == "torch.Size([2, 4])" and kept["stats"]["numel"] == 8
    assert "value" not in kept
    assert ("value" in full["children"][0]["inputs"]["kwargs"]["value"]) == (tensors != "summary")
    trace = tracediff.load_trace(next(tmp_path.glob(f"*{fmt.SUMMARY_SUFFIX}")))
    (node,) = [n for n in trace.nodes() if n.module_path == "CallsAttention.attn"]
    assert [r.slot for r in node.tensors] == ["inputs.args.0", "inputs.kwargs.value", "outputs"]


def test_the_drop_in_strips_every_value_key_as_transformers_does(tmp_path: Path) -> None:
    """transformers' SUMMARY loses a keyword argument named value; the drop-in stays byte-identical."""
    transformers = pytest.importorskip("transformers")
    for name, debugger in (("ours", tracediff.model_addition_debugger_context),
                           ("theirs", transformers.model_addition_debugger_context)):
        model = seeded(CallsAttention)
        with debugger(model, debug_path=str(tmp_path / name), use_repr=False):
            model(toy_input())
    for suffix in (fmt.FULL_SUFFIX, fmt.SUMMARY_SUFFIX):
        (ours,), (theirs,) = (tmp_path / "ours").glob(f"*{suffix}"), (tmp_path / "theirs").glob(f"*{suffix}")
        assert ours.read_bytes() == theirs.read_bytes()
    summary = _tree(tmp_path / "ours", fmt.SUMMARY_SUFFIX)
    assert summary["children"][0]["inputs"]["kwargs"] == {}


def test_a_newer_major_version_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    model = seeded(CallsAttention)
    with tracediff.capture(model, tmp_path, tensors="summary"):
        model(toy_input())
    meta_path = tmp_path / fmt.METADATA_FILE
    meta = json.loads(meta_path.read_text())
    assert meta["format_version"] == fmt.FORMAT_VERSION == "1.8"
    for readable in (1, "1.0", "1.9"):
        meta_path.write_text(json.dumps({**meta, "format_version": readable}))
        assert tracediff.load_trace(tmp_path).model_name == "CallsAttention"
    meta_path.write_text(json.dumps({**meta, "format_version": "2.0"}))
    with pytest.raises(TraceFormatError) as raised:
        tracediff.load_trace(tmp_path)
    assert str(raised.value) == (f'{meta_path}: format_version "2.0" is newer than this tracediff reads (1.x); '
                                 "upgrade tracediff")
    meta_path.write_text(json.dumps({**meta, "format_version": "one"}))
    with pytest.raises(TraceFormatError, match=r'format_version "one" is not "MAJOR.MINOR"'):
        tracediff.load_trace(tmp_path)


def test_the_cli_refuses_a_newer_major_version_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tracediff.cli.main import main

    model = seeded(CallsAttention)
    with tracediff.capture(model, tmp_path / "a", tensors="summary"):
        model(toy_input())
    meta_path = tmp_path / "a" / fmt.METADATA_FILE
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "format_version": "3.0"}))
    assert main(["show", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "newer than this tracediff reads (1.x); upgrade tracediff" in err[0]


@pytest.mark.parametrize(("entry", "is_tensor"), [
    ({"shape": "torch.Size([2])", "dtype": "torch.float32"}, True),
    ({"shape": "torch.Size([])", "dtype": "torch.int64", "value": "./x.safetensors"}, True),
    ({"shape": {"py_type": "tuple", "py_value": [2]}, "dtype": {"py_type": "str", "py_value": "f32"}}, False),
    ({"py_type": "str", "shape": "x", "dtype": "y"}, False),
    ({"shape": "torch.Size([2])"}, False),
    ([{"shape": "torch.Size([2])", "dtype": "torch.float32"}], False),
])
def test_the_tensor_entry_rule(entry: object, is_tensor: bool) -> None:
    assert fmt.is_tensor_entry(entry) is is_tensor


def test_typed_values_round_trip_and_step_records_older_key_is_read() -> None:
    assert fmt.typed_value((1, 2)) == {"py_type": "tuple", "py_value": [1, 2]}
    assert fmt.typed_value_content(fmt.typed_value((1, 2))) == (True, (1, 2))
    assert fmt.typed_value_content({"py_type": "float", "value": 0.5}) == (True, 0.5)
    assert fmt.typed_value_content(fmt.typed_repr("DynamicCache", "DynamicCache()")) == (False, None)


def test_metadata_keys_are_owned_by_the_format() -> None:
    entry = fmt.metadata_entry({"complete": True, "tracediff_version": "0.2.0"})
    assert list(entry) == ["format_version", "tracediff_version", "complete"]
    with pytest.raises(ValueError, match="metadata keys not in the trace format: surprise"):
        fmt.metadata_entry({"surprise": 1})


def test_payload_names() -> None:
    assert fmt.trace_file_names("LlamaModel") == ("LlamaModel_debug_tree_FULL_TENSORS.json",
                                                  "LlamaModel_debug_tree_SUMMARY.json")
    prefix = fmt.call_prefix("M.layers.0", 2)
    assert fmt.payload_name(fmt.payload_name(prefix, "outputs"), 0) == "M.layers.0@2_outputs_0"
    assert fmt.payload_reference(fmt.payload_file_name(fmt.payload_stem("M_inputs_kwargs_a/b"))) == \
        "./M_inputs_kwargs_a_b.safetensors"


def test_capture_writes_the_statistics_keys_the_format_names(tmp_path: Path) -> None:
    from tracediff.capturing.stats import tensor_stats

    assert set(tensor_stats(torch.randn(5))) == set(fmt.STAT_KEYS)
    assert set(tensor_stats(torch.arange(5))) <= set(fmt.STAT_KEYS)


_OWNED_LITERALS = ("_debug_tree", "tracediff_metadata.json", ".safetensors", "py_value", "FULL_TENSORS",
                   "_SUMMARY.json")


@functools.cache
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """String literals of a module, docstrings left out."""
    tree = _parsed(path)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def _literal_definitions(name: str, paths: list[Path]) -> list[str]:
    """Modules that assign ``name`` a value of their own (not another module's constant)."""
    return [str(path.relative_to(PACKAGE)) for path in paths
            for node in ast.walk(_parsed(path))
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets)
            and not isinstance(node.value, (ast.Attribute, ast.Name))]


def test_each_name_of_the_file_format_is_defined_once_in_tracediff_format() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    offenders = [f"{path.relative_to(PACKAGE)}:{line}: {text!r}"
                 for path in modules if path.name != "format.py"
                 for line, text in _string_constants(path)
                 if not any(c.isspace() for c in text) and any(owned in text for owned in _OWNED_LITERALS)]
    assert offenders == []
    for name in ("METADATA_FILE", "STAT_KEYS", "FULL_SUFFIX", "SUMMARY_SUFFIX", "PAYLOAD_SUFFIX"):
        assert _literal_definitions(name, modules) == ["format.py"], name
    trace_modules = [p for p in modules if p.parent.name in ("capturing", "trace")]
    assert _literal_definitions("FORMAT_VERSION", trace_modules) == []


def test_summary_text_drops_value_from_tensor_entries_only_on_both_json_paths() -> None:
    from tests.format.conformance import without_tensor_values
    from tracediff.files.json_text import json_text, json_text_pair

    tensor = {"shape": "torch.Size([2])", "dtype": "torch.float32", "value": "./a.safetensors", "stats": {"numel": 2}}
    tree = {"module_path": "M", "inputs": {"kwargs": {"value": tensor, "other": {"value": {"py_type": "int",
                                                                                          "py_value": 1}}}},
            "outputs": [tensor, {"value": tensor}]}
    expected = without_tensor_values(tree)
    assert json.loads(json_text(tree, drop_key="value", drop_where=fmt.is_tensor_entry)) == expected
    assert json.loads(json_text(tree, indent=None, drop_key="value", drop_where=fmt.is_tensor_entry)) == expected
    full, summary = json_text_pair(tree, drop_key="value", drop_where=fmt.is_tensor_entry)
    assert json.loads(full) == tree and json.loads(summary) == expected
    assert json.loads(summary)["inputs"]["kwargs"]["other"]["value"] == {"py_type": "int", "py_value": 1}
    no_tensor_values = {"module_path": "M", "inputs": {"kwargs": {"value": {"py_type": "int", "py_value": 1}}}}
    assert json_text_pair(no_tensor_values, drop_key="value", drop_where=fmt.is_tensor_entry) == (
        json_text(no_tensor_values),) * 2


def test_unique_payload_stems_remembering_the_last_suffix_are_the_smallest_free_ones() -> None:
    """A decode step calls every module again: the stem of each name starts from its last suffix, and the
    names are the same as searching from ``~1`` every time (the smallest suffix not taken)."""
    import random

    words = ["a", "a~1", "a~2", "b", "a/b", "a_b", "a~1~1"]
    for seed in range(30):
        rng = random.Random(seed)
        names = [rng.choice(words) for _ in range(60)]
        plain: set[str] = set()
        remembered: set[str] = set()
        last: dict[str, int] = {}
        got = [fmt.unique_payload_stem(n, remembered, last) for n in names]
        assert got == [fmt.unique_payload_stem(n, plain) for n in names]
        assert len(set(got)) == len(got)
    taken: set[str] = set()
    last = {}
    stems = [fmt.unique_payload_stem("Model.layers.0.mlp_outputs", taken, last) for _ in range(300)]
    assert stems[0] == "Model.layers.0.mlp_outputs" and stems[-1] == "Model.layers.0.mlp_outputs~299"
    assert last == {"Model.layers.0.mlp_outputs": 299}
