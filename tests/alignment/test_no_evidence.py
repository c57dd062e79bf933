"""A verdict needs evidence: an alignment that compared nothing is undecided (exit 1), never passed."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import tracediff
from tests.alignment.helpers import run_cli
from tracediff.importers.detect import detect_kind

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


class _Counter(torch.nn.Module):
    """A model whose calls pass Python numbers only: its traces hold no tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Identity()

    def forward(self, n: int) -> int:
        return self.inner(n) + 1


def _tensorless_trace(folder: Path) -> Path:
    model = _Counter()
    with tracediff.capture(model, folder):
        model(3)
    return folder


def test_two_traces_without_a_tensor_are_undecided_in_the_library(tmp_path: Path) -> None:
    a, b = _tensorless_trace(tmp_path / "a"), _tensorless_trace(tmp_path / "b")
    result = tracediff.align(a, b)
    assert (result.passed, bool(result), result.verdict, len(result.rows)) == (False, False, "undecided", 0)
    assert result.reason == ("nothing was compared: no tensor of A (_Counter) pairs with a tensor of B (_Counter), "
                             "2 module calls paired; check that both are traces of one model that hold tensors, or "
                             "give --map")
    report = result.to_dict()
    assert (report["passed"], report["verdict"], report["reason"]) == (False, "undecided", result.reason)
    assert "verdict='undecided'" in repr(result)


def test_the_command_exits_1_with_one_line_on_stderr(tmp_path: Path, capsys: Any) -> None:
    a, b = _tensorless_trace(tmp_path / "a"), _tensorless_trace(tmp_path / "b")
    code, out, err = run_cli(["align", str(a), str(b)], capsys)
    assert code == 1
    assert err.splitlines() == [f"tracediff align: undecided: {tracediff.align(a, b).reason}"]
    assert "UNDECIDED: nothing was compared" in out and "PASSED" not in out
    code, out, _ = run_cli(["align", str(a), str(b), "--format", "json"], capsys)
    report = json.loads(out)
    assert (code, report["passed"], report["verdict"]) == (1, False, "undecided")


def test_every_tensor_set_aside_is_undecided(capsys: Any) -> None:
    ref = FIXTURES / "llama_tiny" / "ref"
    code, out, err = run_cli(["align", str(ref), str(ref), "--ignore", "*"], capsys)
    assert code == 1 and "PASSED" not in out
    assert err.startswith("tracediff align: undecided: nothing was compared: every one of the ")
    assert err.rstrip().endswith(" paired tensors was set aside by ignore")


def test_statistics_alone_where_both_traces_hold_payloads_is_undecided() -> None:
    ref = FIXTURES / "llama_tiny" / "ref"
    result = tracediff.align(ref, ref)
    assert result.verdict == "passed" and result.payloads_expected and result.rows
    only_statistics = replace(result, rows=tuple(replace(row, approximate=True) for row in result.rows))
    assert only_statistics.verdict == "undecided" and not only_statistics.passed
    assert only_statistics.reason == ("only recorded statistics were compared, though both traces hold payloads: no "
                                      "payload pair was compared")
    summary_traces = replace(only_statistics, payloads_expected=False)  # traces without payloads: statistics decide
    assert summary_traces.verdict == "passed"


def test_a_divergence_is_evidence_enough() -> None:
    result = tracediff.align(FIXTURES / "llama_tiny" / "ref", FIXTURES / "llama_tiny" / "port_bug")
    assert (result.verdict, result.reason, result.passed) == ("diverged", None, False)


@pytest.mark.parametrize("layout", ["rank{r}", "nested/rank{r}"])
def test_a_folder_of_traces_is_never_read_as_a_dump_of_tensors(tmp_path: Path, layout: str) -> None:
    """Rank folders of a multi-process capture hold traces; read as loose tensors they would pair nothing."""
    for rank in (0, 1):
        shutil.copytree(FIXTURES / "llama_tiny" / "ref", tmp_path / "run" / layout.format(r=rank))
    assert detect_kind(tmp_path / "run") is None
    loose = tmp_path / "loose"
    loose.mkdir()
    shutil.copy(next((FIXTURES / "llama_tiny" / "ref").glob("*.safetensors")), loose / "sub_x.safetensors")
    (loose / "sub").mkdir()
    shutil.copy(next((FIXTURES / "llama_tiny" / "ref").glob("*.safetensors")), loose / "sub" / "y.safetensors")
    assert detect_kind(loose) == "tensors"
