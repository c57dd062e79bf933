"""The ``Alignment`` result: table columns and order, first divergence, origins, dict form, assertion helper."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import tracediff
from tests.alignment.helpers import TraceStore
from tracediff import Alignment, align, assert_traces_close, load_trace

# The columns documented in tracediff/alignment/result.py, in that order.
DOCUMENTED_COLUMNS = [
    "order", "module_path_a", "module_path_b", "call_index", "call_index_b", "tensor", "tensor_a", "shape_a",
    "shape_b", "dtype_a", "dtype_b", "max_abs_err", "max_rel_err", "mean_abs_err", "rms_err", "cosine",
    "mismatch_fraction", "nan_mismatch", "inf_mismatch", "atol", "rtol", "required_atol", "required_rtol",
    "within_tolerance", "approximate", "status", "reason", "module_type", "input_err", "amplification", "origin",
]


@pytest.fixture(scope="module")
def buggy(traces: TraceStore) -> Alignment:
    return align(traces("llama"), traces("llama-up-bug"))


def test_table_has_the_documented_columns(buggy: Alignment) -> None:
    table = buggy.table
    columns = list(table.columns)
    assert [c for c in columns if c in DOCUMENTED_COLUMNS] == DOCUMENTED_COLUMNS
    assert len(table) == len(buggy.rows)
    table.loc[0, "status"] = "edited"
    assert buggy.table.loc[0, "status"] != "edited"  # a fresh copy each time


def test_rows_are_in_b_execution_order(traces: TraceStore, buggy: Alignment) -> None:
    trace_b = load_trace(traces("llama-up-bug"))
    order_b = {(node.module_path, node.call_index, record.slot): record.order for node, record in trace_b.records()}
    positions = [order_b[(row.module_path_b, row.call_index_b, row.tensor)] for row in buggy.rows]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert [row.order for row in buggy.rows] == list(range(len(buggy.rows)))
    assert list(buggy.table["order"]) == list(range(len(buggy.rows)))
    assert list(buggy.table["module_path_b"]) == [row.module_path_b for row in buggy.rows]


def test_first_divergence_is_the_earliest_row_out_of_tolerance(buggy: Alignment) -> None:
    diverged = [row for row in buggy.rows if row.within_tolerance is False]
    assert buggy.first_divergence is diverged[0] and buggy.diverged == diverged
    assert min(row.order for row in diverged) == buggy.first_divergence.order
    table = buggy.table
    assert table[table["within_tolerance"] == False]["order"].min() == buggy.first_divergence.order  # noqa: E712
    assert not buggy and buggy.rows[0].passed and buggy.first_divergence and not buggy.first_divergence.passed


def test_input_error_amplification_and_origin(buggy: Alignment) -> None:
    by_key = {(row.module_path_b, row.tensor): row for row in buggy.rows}
    down_in = by_key[("LlamaModel.layers.1.mlp.down_proj", "inputs.args.0")]
    down_out = by_key[("LlamaModel.layers.1.mlp.down_proj", "outputs")]
    assert down_out.input_err == down_in.max_abs_err
    assert down_out.amplification == pytest.approx(down_out.max_abs_err / down_in.max_abs_err)
    assert down_in.amplification is None  # only output rows have one
    assert (down_in.origin, down_out.origin) == ("inherited", "inherited")
    first = buggy.first_divergence
    assert (first.input_err, first.amplification, first.origin) == (0.0, math.inf, "introduced")
    assert all(row.origin is None for row in buggy.rows if not row.diverged)


def test_to_dict(buggy: Alignment) -> None:
    report = buggy.to_dict()
    assert report["format_version"] == 1 and report["passed"] is False
    assert report["matching"] == "by name"
    assert report["model_a"] == report["model_b"] == "LlamaModel"
    assert report["first_divergence"] == buggy.first_divergence.to_dict()
    assert report["first_divergence"]["module_path_b"] == "LlamaModel.layers.1.mlp.up_proj"
    assert report["rows"] == [row.to_dict() for row in buggy.rows]
    assert list(report["rows"][0]) == list(buggy.table.columns)
    assert report["rows"][0]["shape_b"] == [1, 6]
    assert report["unmatched_a"] == report["unmatched_b"] == [] and report["argument_diffs"] == []
    assert report["summary"]["compared"] == len(buggy.rows)
    assert report["summary"]["diverged"] == len(buggy.diverged)
    assert sum(report["summary"]["statuses"].values()) == len(buggy.rows)


def test_describe_names_the_pair_and_the_tolerance_that_would_pass(buggy: Alignment) -> None:
    first = buggy.first_divergence
    text = first.describe()
    assert text.startswith("LlamaModel.layers.1.mlp.up_proj outputs: max_abs_err=")
    assert f"would pass with atol>={first.required_atol:.3g} or rtol>={first.required_rtol:.3g}" in text


def test_assert_traces_close_names_the_first_divergence(traces: TraceStore, buggy: Alignment) -> None:
    with pytest.raises(AssertionError) as e:
        assert_traces_close(traces("llama"), traces("llama-up-bug"))
    lines = str(e.value).splitlines()
    assert lines[0] == (f"traces differ: {len(buggy.diverged)} of {len(buggy.rows)} compared tensors "
                        "out of tolerance")
    assert lines[1] == f"first divergence (introduced): {buggy.first_divergence.describe()}"


def test_assert_traces_close_passes_the_options_on(traces: TraceStore) -> None:
    result = assert_traces_close(traces("llama"), traces("llama-up-bug"), atol=1.0, rtol=1.0)
    assert isinstance(result, Alignment) and result.passed
    assert_traces_close(traces("ref"), traces("renamed"), map=[["^embed$", "proj_in"]])


def test_assert_traces_close_on_renamed_paths_names_both(traces: TraceStore) -> None:
    with pytest.raises(AssertionError, match=r"first divergence \(introduced\): RefModel\.layers\.1\.fc1 ~ "
                                             r"RenamedPort\.blocks\.1\.up outputs: max_abs_err="):
        tracediff.assert_traces_close(traces("ref"), traces("renamed-bug"))


def test_call_index_is_named_in_descriptions(traces: TraceStore) -> None:
    with pytest.raises(AssertionError, match=r"SharedThrice\.shared \(call 1\) outputs: max_abs_err="):
        assert_traces_close(traces("shared"), traces("shared-bug1"))


class _GlueBug(nn.Module):
    """Two layers, with the parent's own code scaling the activations between them."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[1](self.layers[0](x) * self.scale)


def test_an_error_made_between_module_calls_is_attributed_to_the_parent(tmp_path) -> None:
    x = torch.randn(3, 4)
    for name, scale in (("a", 1.0), ("b", 1.01)):
        model = _GlueBug(scale)
        with tracediff.capture(model, tmp_path / name):
            model(x)
    first = align(tmp_path / "a", tmp_path / "b").first_divergence
    assert first is not None
    assert (first.module_path_b, first.tensor, first.origin) == ("_GlueBug.layers.1", "inputs.args.0",
                                                                 "between modules")
