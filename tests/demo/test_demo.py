"""``tracediff demo``: the planted bug is the first divergence, and a correct port passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tracediff
from tracediff.cli.main import main
from tracediff.demo import BUG_MODULE, RENAME_RULES, DemoResult, run_demo
from tracediff.demo.models import build_reference, example_tokens, port_from_reference
from tracediff.errors import OutputDirError
from tracediff.maps.rules import apply_rename


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    return run_demo(tmp_path_factory.mktemp("demo") / "out")


def test_first_divergence_is_the_planted_bug(demo: DemoResult) -> None:
    first = demo.alignment.first_divergence
    assert first is not None
    assert demo.bug_module == f"PortedLM.{BUG_MODULE}"
    assert first.module_path_b == demo.bug_module
    assert first.module_path_a == "ReferenceLM.blocks.0.attn.rope"
    assert first.tensor.startswith("outputs")
    assert first.origin == "introduced"
    assert demo.found_bug
    # Everything before it in execution order agrees exactly: same weights, same inputs.
    before = [row for row in demo.alignment.rows if row.order < first.order]
    assert before and all(row.max_abs_err == 0 for row in before)


def test_the_rename_map_lines_up_every_module_by_name(demo: DemoResult) -> None:
    reference, port = tracediff.load_trace(demo.reference_trace), tracediff.load_trace(demo.port_trace)
    renamed = {apply_rename(node.relative_path, RENAME_RULES) for node in reference.nodes()}
    port_paths = {node.relative_path for node in port.nodes()}
    assert renamed <= port_paths
    assert port_paths - renamed == {f"layers.{i}.mlp.act_fn" for i in range(3)}  # the port's extra module
    assert not demo.alignment.structural
    assert {u.module_path for u in demo.alignment.unmatched_b} == {f"PortedLM.layers.{i}.mlp.act_fn"
                                                                    for i in range(3)}
    assert not demo.alignment.unmatched_a


def test_demo_folder_holds_traces_map_and_report(demo: DemoResult) -> None:
    assert json.loads(demo.rename_map.read_text()) == {"rename": [list(rule) for rule in RENAME_RULES]}
    assert tracediff.load_trace(demo.port_trace).model_name == "PortedLM"
    text = demo.report.read_text(encoding="utf-8")
    assert text.startswith("<!doctype html>") and demo.bug_module in text
    again = tracediff.align(demo.reference_trace, demo.port_trace,
                            map=[tuple(rule) for rule in json.loads(demo.rename_map.read_text())["rename"]])
    assert again.first_divergence is not None and again.first_divergence.module_path_b == demo.bug_module


def test_without_the_bug_the_traces_pass(demo: DemoResult, tmp_path: Path) -> None:
    clean = run_demo(tmp_path / "clean", plant_bug=False)
    assert clean.alignment.passed, clean.alignment.first_divergence
    assert clean.alignment.first_divergence is None
    assert clean.found_bug  # "found" means: nothing to find
    assert len(clean.alignment.rows) == len(demo.alignment.rows)  # the same tensors were compared


def test_weights_are_copied_so_only_the_bug_changes_the_output() -> None:
    reference = build_reference()
    tokens = example_tokens()
    with torch.no_grad():
        expected = reference(tokens)
        clean = port_from_reference(reference, plant_bug=False)(tokens)
        buggy = port_from_reference(reference, plant_bug=True)(tokens)
    torch.testing.assert_close(clean, expected)
    assert not torch.allclose(buggy, expected, atol=1e-3)
    # Position 0 is not rotated, so the bug cannot show there.
    torch.testing.assert_close(buggy[:, 0], expected[:, 0])


def test_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputDirError, match=r"already exists and is not empty; pass --overwrite"):
        run_demo(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_refuses_a_file(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(OutputDirError, match="is a file"):
        run_demo(target)


def test_cli_demo_runs_refuses_then_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"FIRST DIVERGENCE (introduced): ReferenceLM.blocks.0.attn.rope ~ PortedLM.{BUG_MODULE} outputs.0" \
        in printed
    assert "found it: the first divergence is the planted bug" in printed
    assert f"HTML report: {out / 'report.html'}" in printed
    assert f"tracediff show {out / 'port'}" in printed and "--format html" in printed
    (out / "notes.txt").write_text("kept")

    assert main(["demo", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"tracediff demo: error: {out}: already exists and is not empty; pass --overwrite to "
                            "replace the demo there, or choose another folder with --out DIR\n")

    assert main(["demo", "--out", str(out), "--overwrite"]) == 0
    assert (out / "notes.txt").read_text() == "kept"
    assert "found it" in capsys.readouterr().out


def test_cli_default_folder_is_in_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["demo"]) == 0
    assert (tmp_path / "tracediff-demo" / "report.html").is_file()
    assert "tracediff-demo/port" in capsys.readouterr().out
