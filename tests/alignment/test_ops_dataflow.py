"""Ops pair by dataflow: the same math in another order meets where the results meet; numbers and NaN sources."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff
from tests.alignment import ops_models
from tracediff.cli.main import main
from tracediff.show import show_trace

ATTN_0 = "LlamaModel.layers.0.self_attn"
Rotary = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _reordered(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' rotary embedding with the two products in the other order: the same math."""
    from transformers.models.llama.modeling_llama import rotate_half

    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return rotate_half(q) * sin + q * cos, rotate_half(k) * sin + k * cos


def _reordered_swapped(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The reordered rotary embedding with sin and cos swapped: a bug."""
    from transformers.models.llama.modeling_llama import rotate_half

    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return rotate_half(q) * cos + q * sin, rotate_half(k) * cos + k * sin


def _capture(folder: Path, rotary: Rotary | None = None, model: nn.Module | None = None) -> Path:
    """A tiny Llama captured with ops; ``rotary`` replaces transformers' ``apply_rotary_pos_emb`` for this run."""
    import transformers.models.llama.modeling_llama as llama

    model = model if model is not None else ops_models.tiny_llama("eager")
    stock = llama.apply_rotary_pos_emb
    llama.apply_rotary_pos_emb = rotary or stock
    try:
        with torch.no_grad(), tracediff.capture(model, folder, ops=True):
            model(input_ids=ops_models.input_ids())
    finally:
        llama.apply_rotary_pos_emb = stock
    return folder


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    root = tmp_path_factory.mktemp("dataflow")
    yield {"reference": _capture(root / "reference"), "reordered": _capture(root / "reordered", _reordered),
           "swapped": _capture(root / "swapped", _reordered_swapped)}


def _op_number(tensor_a: str) -> tuple[str, int]:
    """``("torch.Tensor.mul", 3)`` from a row's ``tensor_a`` ``"torch.Tensor.mul #3 outputs"``."""
    found = re.fullmatch(r"(\S+) #(\d+) \S+", tensor_a)
    assert found is not None, tensor_a
    return found[1], int(found[2])


def test_the_same_rotary_math_in_another_order_does_not_diverge(traces: dict[str, Path],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["align", str(traces["reference"]), str(traces["reordered"])]) == 0
    capsys.readouterr()
    result = tracediff.align(traces["reference"], traces["reordered"])
    assert result.passed and result.sources == ()
    rows = [row for row in result.rows if row.module_path_b == ATTN_0 and row.op is not None]
    # the two products pair with the products that compute the same thing, not with the op at the same place
    crossed = {(row.op_index, _op_number(row.tensor_a)[1]) for row in rows
               if row.op == "torch.Tensor.mul" and row.tensor == "outputs"}
    assert {(2, 3), (3, 0)} <= crossed  # B: rotate_half(q) * sin, q * cos; A: q * cos, rotate_half(q) * sin
    assert {row.matched_by for row in rows} == {"dataflow"}
    # the sum takes its terms in the other order: each term is compared with its twin
    add_inputs = {row.tensor: row.tensor_a for row in rows if row.op == "torch.Tensor.add" and row.op_index == 4}
    assert add_inputs == {"inputs.args.0": "torch.Tensor.add #4 inputs.args.1",
                          "inputs.args.1": "torch.Tensor.add #4 inputs.args.0",
                          "outputs": "torch.Tensor.add #4 outputs"}


def test_sin_and_cos_swapped_in_the_reordered_port_are_named_at_the_op(traces: dict[str, Path]) -> None:
    result = tracediff.align(traces["reference"], traces["swapped"])
    first = result.first_divergence
    assert first is not None
    # B's rotate_half(q) * cos, paired with A's rotate_half(q) * sin: the table it reads is the other one
    assert (first.module_path_b, first.op, first.op_index, first.tensor, first.origin) == (
        ATTN_0, "torch.Tensor.mul", 2, "inputs.args.1", "between modules")
    assert first.tensor_a == "torch.Tensor.mul #3 inputs.args.1"
    assert all(row.within_tolerance for row in result.rows if row.order < first.order)


def test_scores_scaled_before_the_matmul_meet_the_reference_after_it(traces: dict[str, Path], tmp_path: Path) -> None:
    # (q * scale) @ k^T against (q @ k^T) * scale: the intermediates differ, the scores do not
    port = _capture(tmp_path / "port", model=ops_models.plant(ops_models.tiny_llama("eager"), [0, 1], "scale_first"))
    result = tracediff.align(traces["reference"], port)
    assert result.passed, result.first_divergence
    (meeting,) = [row for row in result.rows if row.module_path_b == ATTN_0 and row.op == "torch.matmul"
                  and row.tensor == "outputs" and row.tensor_a.startswith("torch.Tensor.mul ")]
    assert meeting.matched_by == "value" and meeting.status in ("identical", "close")
    unmatched_b = {u.tensor for u in result.unmatched_b if u.module_path == ATTN_0}
    assert any(t and t.endswith("torch.Tensor.mul") for t in unmatched_b)  # q * scale: nothing equals it in A


def test_show_and_align_number_the_ops_the_same_way(traces: dict[str, Path],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    reference, port = traces["reference"], traces["reordered"]
    result = tracediff.align(reference, port)
    shown = {}
    for side, trace in (("a", reference), ("b", port)):
        assert main(["show", str(trace), "--format", "json"]) == 0
        shown[side] = {(node["module_path"], node["call_index"], node["op_index"]): node["op"]
                       for node in json.loads(capsys.readouterr().out)["nodes"] if "op" in node}
    op_rows = [row for row in result.rows if row.op is not None]
    assert op_rows and any(row.op_index != _op_number(row.tensor_a)[1] for row in op_rows)
    for row in op_rows:
        assert shown["b"][(row.module_path_b, row.call_index_b, row.op_index)] == row.op
        op_a, index_a = _op_number(row.tensor_a)
        assert shown["a"][(row.module_path_a, row.call_index, index_a)] == op_a
    # the same number in the text of both commands
    row = next(r for r in op_rows if r.op_index != _op_number(r.tensor_a)[1])
    view = show_trace(port, path=row.module_path_b.split(".", 1)[1], depth=1)
    assert f"#{row.op_index} {row.op}" in [node.name for node in view.nodes]


class _Gate(nn.Module):
    """``out(exp(f(proj(x)) * 0.5))``; the port's ``f`` takes a log, which makes NaN from negative inputs."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        self.port = port
        self.proj, self.out = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        if self.port:
            h = torch.log(h).reshape(-1, 8).reshape(h.shape)  # a view between the log and what reads it
        return self.out(torch.exp(h * 0.5))  # the mul and the exp only spread the NaN


class _Model(nn.Module):
    def __init__(self, port: bool) -> None:
        super().__init__()
        self.embed, self.gate, self.head = nn.Linear(8, 8), _Gate(port), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gate(self.embed(x)))


def test_nan_is_attributed_to_the_op_that_made_it_from_finite_inputs(tmp_path: Path) -> None:
    folders = []
    for name, port in (("reference", False), ("port", True)):
        torch.manual_seed(0)
        model = _Model(port).eval()
        with torch.no_grad(), tracediff.capture(model, tmp_path / name, ops=True):
            model(torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(3)))
        folders.append(tmp_path / name)
    result = tracediff.align(*folders)
    first = result.first_divergence
    assert first is not None and first.nan_mismatch > 0
    assert (first.module_path_b, first.op, first.op_index, first.tensor, first.origin) == (
        "_Model.gate", "torch.log", 0, "outputs", "introduced")
    assert [(s.op, s.tensor) for s in result.sources] == [("torch.log", "outputs")]
    spread = [row for row in result.rows if row.op in ("torch.Tensor.mul", "torch.exp") and row.diverged]
    assert spread and all(row.origin == "inherited" for row in spread)
