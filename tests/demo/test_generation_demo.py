"""``tracediff demo --generate``: a bug of decode steps only is named at its step, position and module."""

from __future__ import annotations

from pathlib import Path

import pytest

import tracediff
from tracediff.cli.main import main
from tracediff.demo import decoding, run_generation_demo


def test_the_cli_names_the_first_diverging_step_position_and_module(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    code = main(["demo", "--generate", "--out", str(out)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert "decode steps: compared 0-5 (A holds 6, B 6); first diverging step 1 (5 of 6 steps diverge)" in lines
    assert any(line.startswith("FIRST DIVERGENCE (introduced): DecodingLM.blocks.0.attn.rope ~ "
                               "DecodingPort.blocks.0.attn.rope (step 1, position 8) outputs.0: ") for line in lines)
    assert "found it: decode step 1, position 8, DecodingPort.blocks.0.attn.rope: the planted bug" in lines
    assert f"HTML report: {out / 'report.html'}" in lines
    assert f"  tracediff align {out / 'reference'} {out / 'port'} --step 1" in lines


def test_the_prefill_passes_and_every_decode_step_diverges(tmp_path: Path) -> None:
    demo = run_generation_demo(tmp_path / "demo")
    assert demo.found_bug and (demo.bug_step, demo.bug_position) == (1, decoding.PROMPT_LEN)
    steps = demo.alignment.steps
    assert steps is not None and steps.diverged == tuple(range(1, decoding.NEW_TOKENS))
    assert tracediff.align(demo.reference_trace, demo.port_trace, step=0).passed
    assert all(row.max_abs_err == 0 for row in demo.alignment.rows if row.step == 0)  # same weights, same code
    assert "position-strip" in demo.report.read_text(encoding="utf-8")


def test_without_the_bug_every_step_passes(tmp_path: Path) -> None:
    demo = run_generation_demo(tmp_path / "demo", plant_bug=False)
    assert demo.alignment.passed and demo.found_bug


def test_the_demo_is_deterministic(tmp_path: Path) -> None:
    runs = [run_generation_demo(tmp_path / name).alignment.first_divergence for name in ("a", "b")]
    assert runs[0] is not None and runs[1] is not None
    assert runs[0].max_abs_err == runs[1].max_abs_err and runs[0].order == runs[1].order


def test_a_folder_in_use_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "notes.txt").write_text("mine")
    assert main(["demo", "--generate", "--out", str(tmp_path / "demo")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"tracediff demo: error: {tmp_path / 'demo'}: already exists and is not empty; pass --overwrite to replace "
        "the demo there, or choose another folder with --out DIR")
