"""Matching nodes by name, rename rules and structure, and tensors within matched nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.alignment.helpers import RENAME_RULES, TraceStore
from tracediff import TraceFormatError, Unmatched, UsageError, align, load_trace
from tracediff.alignment.pairing.calls import match_nodes, pair_tensors, suggest_rename
from tracediff.maps.rules import apply_rename, check_rename, load_rename_file


def _pair(traces: TraceStore, a: str, b: str, path: str) -> tuple:
    matching = match_nodes(load_trace(traces(a)), load_trace(traces(b)), [])
    (pair,) = [(x, y) for x, y in matching.pairs if x.relative_path == path]
    return pair


def test_same_names_match_by_name(traces: TraceStore) -> None:
    a, b = load_trace(traces("ref")), load_trace(traces("port"))
    matching = match_nodes(a, b, [])
    assert not matching.structural
    assert [(x.module_path, y.module_path) for x, y in matching.pairs][:3] == [
        ("RefModel", "PortModel"), ("RefModel.embed", "PortModel.embed"), ("RefModel.layers.0", "PortModel.layers.0")]
    assert all(x.relative_path == y.relative_path and x.call_index == y.call_index for x, y in matching.pairs)
    assert matching.unmatched_a == () and matching.unmatched_b == ()


def test_calls_match_by_call_index(traces: TraceStore) -> None:
    matching = match_nodes(load_trace(traces("shared")), load_trace(traces("shared-hf")), [])
    calls = [(x.call_index, y.call_index) for x, y in matching.pairs if x.relative_path == "shared"]
    assert calls == [(0, 0), (1, 1), (2, 2)]


def test_rename_rules_apply_in_order_to_a_paths() -> None:
    assert apply_rename("layers.2.fc1", [tuple(r) for r in RENAME_RULES]) == "blocks.2.up"
    assert apply_rename("embed", [tuple(r) for r in RENAME_RULES]) == "proj_in"
    assert apply_rename("", [tuple(r) for r in RENAME_RULES]) == ""
    assert apply_rename("a.b", [("a", "x"), ("x", "y")]) == "y.b"  # in order, each on the previous result


def test_structural_fallback_below_half_matched(traces: TraceStore) -> None:
    a, b = load_trace(traces("ref")), load_trace(traces("renamed"))
    matching = match_nodes(a, b, [])
    assert matching.structural  # only the root lines up by name
    assert len(matching.pairs) == len(b.nodes())
    assert [y.enter_order for _, y in matching.pairs] == sorted(y.enter_order for _, y in matching.pairs)


def test_suggest_rename_generalizes_layer_numbers(traces: TraceStore) -> None:
    a, b = load_trace(traces("ref")), load_trace(traces("renamed"))
    rules = suggest_rename(match_nodes(a, b, []).pairs)
    assert rules == [(r"^embed(?=\.|$)", "proj_in"), (r"^head(?=\.|$)", "proj_out"), (r"^layers(?=\.|$)", "blocks"),
                     (r"^(blocks\.\d+\.)norm(?=\.|$)", r"\1ln"), (r"^(blocks\.\d+\.)fc1(?=\.|$)", r"\1up"),
                     (r"^(blocks\.\d+\.)act(?=\.|$)", r"\1relu"), (r"^(blocks\.\d+\.)fc2(?=\.|$)", r"\1down")]
    for x, y in match_nodes(a, b, []).pairs:
        assert apply_rename(x.relative_path, rules) == y.relative_path


def test_pairs_by_slot(traces: TraceStore) -> None:
    x, y = _pair(traces, "styles", "styles", "pair")
    pairs, only_a, only_b = pair_tensors(x, y)
    assert [(ra.slot, rb.slot) for ra, rb in pairs] == [("inputs.args.0", "inputs.args.0"), ("outputs.0", "outputs.0"),
                                                        ("outputs.1", "outputs.1")]
    assert only_a == [] and only_b == []


def test_positional_and_keyword_inputs_pair(traces: TraceStore) -> None:
    x, y = _pair(traces, "styles", "styles-keyword", "scale")
    pairs, only_a, only_b = pair_tensors(x, y)
    assert [(ra.slot, rb.slot) for ra, rb in pairs] == [("outputs", "outputs"),
                                                        ("inputs.args.0", "inputs.kwargs.input")]
    assert only_a == [] and only_b == []
    result = align(traces("styles"), traces("styles-keyword"))
    assert result.passed and result.unmatched_a == () and result.unmatched_b == ()
    row = next(r for r in result.rows if r.module_path_b == "CallStyles.scale" and r.tensor.startswith("inputs"))
    assert (row.tensor_a, row.tensor, row.status) == ("inputs.args.0", "inputs.kwargs.input", "identical")


def test_extra_output_element_is_an_unmatched_tensor(traces: TraceStore) -> None:
    result = align(traces("styles"), traces("styles-extra-output"))
    assert result.passed
    assert result.unmatched_a == ()
    assert result.unmatched_b == (Unmatched("CallStyles.pair", 0, "outputs.2"),)


def test_parent_outputs_missing_on_one_side_are_not_unmatched(traces: TraceStore) -> None:
    x, y = _pair(traces, "ref-hf", "ref", "layers.0")
    assert not x.has_outputs and y.has_outputs
    pairs, only_a, only_b = pair_tensors(x, y)
    assert [ra.slot for ra, _ in pairs] == ["inputs.args.0"] and only_a == [] and only_b == []


# --- rename files -------------------------------------------------------------------------------------------


def test_load_rename_file(tmp_path: Path) -> None:
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"rename": RENAME_RULES}))
    assert load_rename_file(path) == [tuple(r) for r in RENAME_RULES]


@pytest.mark.parametrize("text, error, message", [
    ("{oops", TraceFormatError,
     "{path}: not a JSON rename map (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
    ('{"rename": "x"}', TraceFormatError, '{path}: expected {{"rename": [[regex, replacement], ...]}}'),
    ('[["a", "b"]]', TraceFormatError, '{path}: expected {{"rename": [[regex, replacement], ...]}}'),
    ('{"rename": [["a"]]}', UsageError, "{path}: rule 0 is ['a']; expected [regex, replacement]"),
    ('{"rename": [["a", "b"], ["(", "x"]]}', UsageError,
     "{path}: rule 1 regex '(' does not compile (missing ), unterminated subpattern at position 0)"),
])
def test_bad_rename_files(tmp_path: Path, text: str, error: type, message: str) -> None:
    path = tmp_path / "map.json"
    path.write_text(text)
    with pytest.raises(error) as e:
        load_rename_file(path)
    assert str(e.value) == message.format(path=path)


def test_missing_rename_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        load_rename_file(tmp_path / "nope.json")
    assert str(e.value) == f"{tmp_path / 'nope.json'}: rename map not found"


def test_library_rename_is_checked(traces: TraceStore) -> None:
    with pytest.raises(UsageError) as e:
        align(traces("ref"), traces("renamed"), map=[("[", "x")])
    assert str(e.value) == "rename: rule 0 regex '[' does not compile (unterminated character set at position 0)"
    assert check_rename(None) == []
