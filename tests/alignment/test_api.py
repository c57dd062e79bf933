"""The Python API behaves as Python users expect: truth values, symmetric names, short reprs, rename forms."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import tracediff
from tests.alignment.helpers import RENAME_RULES, TraceStore
from tracediff.alignment.result import TABLE_COLUMNS, Alignment, TensorComparison


@pytest.fixture(scope="module")
def buggy(traces: TraceStore) -> Alignment:
    return tracediff.align(traces("ref"), traces("renamed-bug"), map=RENAME_RULES)


@pytest.fixture(scope="module")
def clean(traces: TraceStore) -> Alignment:
    return tracediff.align(traces("ref"), traces("renamed"), map=RENAME_RULES)


# --- truth values -------------------------------------------------------------------------------------------


def test_first_divergence_is_truthy_exactly_when_there_is_one(buggy: Alignment, clean: Alignment) -> None:
    first = buggy.first_divergence
    assert first  # a diverged row is an object like any other: truthy
    assert first.diverged and not first.passed
    assert clean.first_divergence is None
    assert not buggy and clean  # the whole result keeps truthiness = passed


def test_rows_have_no_truth_value_of_their_own(buggy: Alignment) -> None:
    assert "__bool__" not in vars(type(buggy.rows[0]))
    assert all(bool(row) for row in buggy.rows)
    assert [row.passed for row in buggy.rows] == [not row.diverged and row.status != "unreadable"
                                                  for row in buggy.rows]
    assert buggy.passed == all(row.passed for row in buggy.rows)


# --- symmetric names ----------------------------------------------------------------------------------------


def test_symmetric_names_mirror_the_old_ones(buggy: Alignment) -> None:
    for row in buggy.rows:
        assert row.call_index_a == row.call_index
        assert row.tensor_b == row.tensor


def test_json_keys_keep_the_contract_and_add_the_symmetric_names(buggy: Alignment) -> None:
    first = buggy.to_dict()["first_divergence"]
    assert first["call_index"] == first["call_index_a"] == buggy.first_divergence.call_index
    assert first["tensor"] == first["tensor_b"] == buggy.first_divergence.tensor
    assert {"call_index_b", "tensor_a", "module_path_a", "module_path_b"} <= set(first)
    keys = list(first)
    assert keys.index("call_index_a") == keys.index("call_index") + 1
    assert keys.index("tensor_b") == keys.index("tensor") + 1


def test_table_has_the_symmetric_columns_next_to_the_old_ones(buggy: Alignment) -> None:
    table = buggy.table
    assert list(table.columns) == TABLE_COLUMNS
    assert (table["call_index_a"] == table["call_index"]).all()
    assert (table["tensor_b"] == table["tensor"]).all()
    columns = list(table.columns)
    assert columns.index("call_index_a") == columns.index("call_index") + 1


# --- reprs --------------------------------------------------------------------------------------------------


def test_repr_is_one_short_line(buggy: Alignment) -> None:
    text = repr(buggy)
    assert "\n" not in text and len(text) < 800
    assert text.startswith("Alignment(passed=False, compared=")
    row = repr(buggy.first_divergence)
    assert "\n" not in row and len(row) < 400 and row.startswith("TensorComparison(order=")


def test_repr_html_shows_the_verdict_and_the_first_divergence(buggy: Alignment, clean: Alignment) -> None:
    page = buggy._repr_html_()
    assert "DIVERGED" in page and "first divergence" in page
    assert buggy.first_divergence.module_path_b.split(".")[-1] in page
    assert "PASSED" in clean._repr_html_()
    assert len(page) < 5000


def test_repr_html_escapes_what_it_shows(buggy: Alignment) -> None:
    from dataclasses import replace

    hostile = replace(buggy, trace_a="<script>alert(1)</script>")
    page = hostile._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_to_html_goes_through_the_renderer_registry(clean: Alignment) -> None:
    from tracediff.display import renderer_for
    from tracediff.render.html import render_html

    assert renderer_for(clean, "html")(clean) == render_html(clean)
    with pytest.raises(LookupError, match="no pdf renderer for Alignment"):
        renderer_for(clean, "pdf")


# --- rename forms -------------------------------------------------------------------------------------------


def test_rename_accepts_the_map_file_object_and_its_path(traces: TraceStore, clean: Alignment,
                                                         tmp_path: Path) -> None:
    mapping = {"rename": RENAME_RULES, "slots": []}  # keys it does not handle are left alone
    path = tmp_path / "map.json"
    path.write_text(json.dumps(mapping), encoding="utf-8")
    tuples = [tuple(rule) for rule in RENAME_RULES]
    for spec in (mapping, path, str(path), tuples):
        result = tracediff.align(traces("ref"), traces("renamed"), map=spec)
        assert result.passed and len(result.rows) == len(clean.rows), type(spec)


def test_rename_is_the_deprecated_name_of_map(traces: TraceStore, clean: Alignment) -> None:
    with pytest.warns(DeprecationWarning, match=r"rename= is deprecated .* pass map="):
        old = tracediff.align(traces("ref"), traces("renamed"), rename=RENAME_RULES)
    assert old.passed and [r.to_dict() for r in old.rows] == [r.to_dict() for r in clean.rows]
    with pytest.warns(DeprecationWarning):
        assert tracediff.assert_traces_close(traces("ref"), traces("renamed"), rename=RENAME_RULES).passed
    with pytest.raises(tracediff.UsageError, match="map= and rename= name the same thing; pass map= only"):
        tracediff.align(traces("ref"), traces("renamed"), map=RENAME_RULES, rename=RENAME_RULES)


def test_rename_refuses_anything_else(traces: TraceStore) -> None:
    with pytest.raises(tracediff.UsageError, match="rename: got int; expected a list"):
        tracediff.align(traces("ref"), traces("renamed"), map=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='the "rename" entry is str'):
        tracediff.align(traces("ref"), traces("renamed"), map={"rename": "blocks"})


# --- errors -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "builtin"), [
    ("UsageError", ValueError), ("TraceFormatError", ValueError), ("UnsafePathError", ValueError),
    ("CaptureSpecError", ValueError), ("PayloadError", OSError), ("InputsFileError", OSError),
    ("OutputDirError", OSError),
])
def test_every_error_is_also_the_matching_builtin(name: str, builtin: type) -> None:
    cls = getattr(tracediff, name)
    assert issubclass(cls, tracediff.TracediffError) and issubclass(cls, builtin)
    error = cls("trace.json: not a trace")
    assert str(error) == "trace.json: not a trace"
    with pytest.raises(builtin, match="not a trace"):
        raise error


def test_every_error_class_is_a_builtin_too() -> None:
    """Also the classes added later: each subclass of TracediffError is a ValueError or an OSError."""
    from tracediff import errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        if cls is not errors.TracediffError:
            assert issubclass(cls, (ValueError, OSError)), name


def test_a_missing_trace_is_caught_as_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=str(tmp_path / "nowhere")):
        tracediff.align(tmp_path / "nowhere", tmp_path / "nowhere")


def test_metrics_of_the_rows_are_plain_floats(buggy: Alignment) -> None:
    assert all(isinstance(row.max_abs_err, float) and not math.isnan(row.max_abs_err) for row in buggy.rows)


def test_the_fast_row_builder_builds_the_same_frozen_row_as_the_class() -> None:
    import dataclasses

    from tracediff.alignment.result import build_row

    values = dict(order=3, module_path_a="A.x", module_path_b="B.x", call_index=1, call_index_b=2, tensor="outputs",
                  tensor_a="outputs.0", shape_a=(2, 3), shape_b=(2, 3), dtype_a="torch.float32",
                  dtype_b="torch.bfloat16", max_abs_err=0.5, max_rel_err=0.25, mean_abs_err=0.1, rms_err=0.2,
                  cosine=0.99, mismatch_fraction=0.5, nan_mismatch=0, inf_mismatch=1, atol=1e-5, rtol=1e-3,
                  required_atol=0.5, required_rtol=0.3, within_tolerance=False, approximate=False, status="diverged")
    built, reference = build_row(**values), TensorComparison(**values)
    assert type(built) is TensorComparison and built == reference
    assert [getattr(built, f.name) for f in dataclasses.fields(TensorComparison)] == \
        [getattr(reference, f.name) for f in dataclasses.fields(TensorComparison)]  # the defaults too
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.status = "close"  # type: ignore[misc]
    with pytest.raises(TypeError):
        build_row(order=1)  # a field without a default is still required


def test_a_draft_row_puts_every_value_in_its_own_field() -> None:
    """``draft_row`` passes arguments by position: each field must get its own value, none swapped."""
    import dataclasses

    from tracediff.alignment.pairing.make import pair_of
    from tracediff.alignment.rows import draft_row, freeze_rows
    from tracediff.compare.measurement import ANNOTATIONS, Measurement
    from tracediff.trace.model import Node, TensorRecord

    metrics = {f.name: f"metric {f.name}" for f in dataclasses.fields(Measurement)  # every field a comparison fills
               if f.name not in ANNOTATIONS}  # (not the annotations' raw findings: annotate_rows sets those)
    who = dict(order=3, module_path_a="A.x", module_path_b="B.x", call_index=1, call_index_b=2, tensor="outputs",
               tensor_a="outputs.0", shape_a=(2, 3), shape_b=(3, 2), dtype_a="torch.float32",
               dtype_b="torch.bfloat16", atol=1e-5, rtol=1e-3, module_type="Linear")
    pair = pair_of(Node("A.x", "x", 1, None, 1, 0), TensorRecord("outputs.0", 0, (2, 3), "torch.float32", {}),
                   Node("B.x", "x", 2, "Linear", 1, 0), TensorRecord("outputs", 0, (3, 2), "torch.bfloat16", {}))
    (row,) = freeze_rows([draft_row(3, pair, 1e-5, 1e-3, Measurement(**metrics))])
    assert row == TensorComparison(**who, **metrics)
    assert row.matched_by == "name" and row.origin is None  # the rest keep their defaults


def test_a_trace_named_twice_is_read_once(traces: TraceStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracediff.alignment import engine

    read: list[str] = []
    real = engine.load_trace

    def counting(path: str | Path) -> tracediff.Trace:
        read.append(str(path))
        return real(path)

    monkeypatch.setattr(engine, "load_trace", counting)
    ref = traces("ref")
    same = tracediff.align(ref, Path(ref) / ".." / Path(ref).name, baseline=ref)  # one folder, spelled two ways
    assert same.passed and len(read) == 1
    read.clear()
    other = tracediff.align(ref, traces("renamed"), map=RENAME_RULES)
    assert other.passed and len(read) == 2


def test_a_draft_takes_the_later_stages_fields_and_freezes_into_a_row_that_refuses_changes() -> None:
    import dataclasses

    from tracediff.alignment.pairing.make import pair_of
    from tracediff.alignment.result import fill
    from tracediff.alignment.rows import RowDraft, draft_row, freeze_rows
    from tracediff.compare.measurement import unmeasured
    from tracediff.trace.model import Node, TensorRecord

    record = TensorRecord("outputs", 0, (2,), "torch.float32", {})
    pair = pair_of(Node("A.x", "x", 0, None, 1, 0), record, Node("B.x", "x", 0, None, 1, 0), record)
    draft = draft_row(0, pair, 1e-5, 1e-3, unmeasured("no_data", None, ""))
    draft.growth = 2.5
    assert isinstance(draft, RowDraft) and draft.growth == 2.5 and draft.origin is None
    copy = fill(draft, origin="introduced")  # a copy of its own class: a draft stays a draft
    assert type(copy) is RowDraft and copy.origin == "introduced" and draft.origin is None
    (row,) = freeze_rows([draft])
    assert row is draft and type(row) is TensorComparison and row.growth == 2.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.growth = 3.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        freeze_rows([row])  # type: ignore[list-item]  # a finished row is never re-opened
    changed = fill(row, origin="inherited")
    assert type(changed) is TensorComparison and changed.origin == "inherited" and row.origin is None
    with pytest.raises(TypeError, match="diverged"):
        fill(row, diverged=True)  # a property, not a field


def test_the_fields_a_draft_may_set_are_fields_of_the_row_with_the_same_types() -> None:
    from tracediff.alignment.rows import RowDraft

    declared = RowDraft.__annotations__
    assert declared and all(TensorComparison.__annotations__[name] == kind for name, kind in declared.items())


def test_the_rows_align_returns_are_frozen(buggy: Alignment) -> None:
    import dataclasses

    every = (*buggy.rows, *buggy.sources, *buggy.ignored)
    assert every and all(type(row) is TensorComparison for row in every)
    for name in ("status", "origin", "growth", "reason"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(buggy.rows[0], name, None)


def test_verdict_summary_and_divergences_follow_each_results_own_rows(buggy: Alignment, clean: Alignment) -> None:
    """They are counted once per result (a large report asks for each several times), never shared between
    results: a result with other rows is judged on them."""
    import collections
    import dataclasses

    for result in (buggy, clean):
        diverged = [row for row in result.rows if row.diverged]
        assert result.diverged == diverged and result.first_divergence is (diverged[0] if diverged else None)
        assert result.summary()["statuses"] == dict(collections.Counter(row.status for row in result.rows))
        assert result.summary()["diverged"] == len(diverged)
        assert result.passed is (not diverged and not result.unreadable)
    assert clean.passed and not buggy.passed  # counted above, for each
    swapped = dataclasses.replace(clean, rows=buggy.rows)
    assert not swapped.passed and swapped.first_divergence is buggy.first_divergence
    assert clean.passed and clean.first_divergence is None
    result_list = swapped.diverged
    result_list.clear()  # a copy: the result's own list stays whole
    assert swapped.diverged and swapped.first_divergence is not None


def test_the_report_counts_calls_by_how_they_were_paired(clean: Alignment) -> None:
    import dataclasses

    from tracediff.render.matching import pairing_counts

    by_name = dataclasses.replace(clean, rows=tuple(dataclasses.replace(row, matched_by="name")
                                                    for row in clean.rows))
    assert pairing_counts(by_name) == ""  # every call by name: nothing to say
    moved = sorted({row.module_path_b for row in by_name.rows})[1:3]  # two calls, not the root
    rows = tuple(dataclasses.replace(row, matched_by="structure") if row.module_path_b in moved else row
                 for row in by_name.rows)
    calls = {(row.module_path_a, row.module_path_b, row.call_index_b) for row in rows}
    by_structure = {(row.module_path_a, row.module_path_b, row.call_index_b) for row in rows
                    if row.matched_by == "structure"}
    assert by_structure and calls - by_structure
    assert pairing_counts(dataclasses.replace(clean, rows=rows)) == \
        f" ({len(calls - by_structure)} by name, {len(by_structure)} by structure)"
    assert pairing_counts(clean) == " (1 by name, 17 by map)"  # the root by name, every other call by the map


def test_comparing_on_worker_threads_changes_no_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small traces are compared on one thread (see engine._workers); forced onto threads, the report is the same."""
    from tracediff.alignment import engine

    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "llama_tiny"
    serial = tracediff.align(fixtures / "ref", fixtures / "port_bug", baseline=fixtures / "native").to_dict()
    monkeypatch.setattr(engine, "_THREADED_BYTES", 0)
    monkeypatch.setattr(engine.os, "cpu_count", lambda: 2)
    threaded = tracediff.align(fixtures / "ref", fixtures / "port_bug", baseline=fixtures / "native").to_dict()
    assert json.dumps(threaded, sort_keys=True, default=repr) == json.dumps(serial, sort_keys=True, default=repr)
