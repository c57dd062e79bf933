"""``tracediff steps`` in-process: exit codes, the three formats, and one-line errors."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tracediff.cli.main import main
from tracediff.steps import StepRecorder
from tracediff.steps.result import STEP_COLUMNS


def _run(out: Path, *, steps: list[int] | None = None, bump_lr_at: int | None = None,
         fail_at: int | None = None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.linspace(-1, 1, 12).reshape(4, 3)
    with StepRecorder(model, out, optimizer=opt, steps=steps) as rec:
        for k in range(4):
            if k == bump_lr_at:
                opt.param_groups[0]["lr"] = 0.02
            try:
                with rec.step({"x": x}):
                    model(x).pow(2).mean().backward()
                    if k == fail_at:
                        raise FloatingPointError("loss is nan")
                    opt.step()
                    opt.zero_grad()
            except FloatingPointError:
                opt.zero_grad()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    paths = {"a": root / "a", "same": root / "same", "lr": root / "lr", "late": root / "late"}
    _run(paths["a"])
    _run(paths["same"])
    _run(paths["lr"], bump_lr_at=2)
    _run(paths["late"], steps=[3])
    return paths


def test_identical_runs_exit_0(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["steps", str(runs["a"]), str(runs["same"])]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"{runs['a']} vs {runs['same']} (atol=0, rtol=0): identical over 4 shared steps"


def test_divergence_exits_1_and_names_step_group_and_entry(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["steps", str(runs["a"]), str(runs["lr"])]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{runs['a']} vs {runs['lr']} (atol=0, rtol=0): diverged at step 2, optimizer param_groups.0.lr"
    assert lines[2] == "first divergence: step 2, rank 0, group optimizer, param_groups.0.lr: value 0.01 vs 0.02"


def test_json_output_has_the_documented_keys(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["steps", str(runs["a"]), str(runs["lr"]), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["format_version"] == 1 and report["passed"] is False
    first = report["first_divergence"]
    assert (first["step"], first["group"], first["name"]) == (2, "optimizer", "param_groups.0.lr")
    assert [row["step"] for row in report["steps"]] == [0, 1, 2, 3]
    assert list(report["steps"][0]) == list(STEP_COLUMNS)
    assert [row["status"] for row in report["steps"]] == ["identical", "identical", "diverged", "diverged"]


def test_json_output_of_identical_runs_has_null_divergence(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["steps", str(runs["a"]), str(runs["same"]), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is True and report["first_divergence"] is None


def test_csv_output_to_a_file(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "steps.csv"
    assert main(["steps", str(runs["a"]), str(runs["lr"]), "--format", "csv", "--output", str(target)]) == 1
    assert capsys.readouterr().out == ""
    rows = list(csv.DictReader(io.StringIO(target.read_text())))
    assert list(rows[0]) == list(STEP_COLUMNS)
    assert [(r["step"], r["first_group"], r["first_name"]) for r in rows][2] == ("2", "optimizer", "param_groups.0.lr")


def test_different_schedules_compare_shared_steps(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["steps", str(runs["a"]), str(runs["late"]), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [row["step"] for row in report["steps"]] == [3]
    assert (report["only_in_a"], report["only_in_b"]) == ([0, 1, 2], [])


def test_incomplete_records_are_reported(runs: dict[str, Path], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path / "failed", fail_at=3)  # the last step raised before the update: its data still match
    assert main(["steps", str(runs["a"]), str(tmp_path / "failed")]) == 0
    assert "incomplete records (the step raised or the run stopped): step 3 in B" in capsys.readouterr().out
    assert main(["steps", str(runs["a"]), str(tmp_path / "failed"), "--format", "json"]) == 0
    last = json.loads(capsys.readouterr().out)["steps"][-1]
    assert (last["step"], last["complete_a"], last["complete_b"]) == (3, True, False)


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    return captured.err.rstrip("\n")


def test_folder_that_is_not_a_run_exits_2(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["steps", str(runs["a"]), str(tmp_path)], capsys)
    assert err == (f"tracediff steps: error: {tmp_path}: no run.json; "
                   "not a training record written by tracediff.StepRecorder")


def test_missing_folder_exits_2(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["steps", str(tmp_path / "nope"), str(runs["a"])], capsys)
    assert err == (f"tracediff steps: error: {tmp_path / 'nope'}: not a folder; "
                   "expected a training record written by tracediff.StepRecorder")


def test_truncated_record_exits_2(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(runs["same"], broken)
    record = broken / "step=1" / "rank0.json"
    record.write_text(record.read_text()[:100])
    err = _error(["steps", str(runs["a"]), str(broken)], capsys)
    assert err.startswith(f"tracediff steps: error: {record}: invalid JSON in the step record (")
    assert err.endswith("); the file is truncated or was edited")


def test_foreign_run_json_exits_2(tmp_path: Path, runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run.json").write_text('{"format": "something-else"}')
    err = _error(["steps", str(tmp_path), str(runs["a"])], capsys)
    assert err == (f'tracediff steps: error: {tmp_path / "run.json"}: expected "format": "tracediff-steps"; '
                   "not a training record written by tracediff.StepRecorder")


def test_negative_tolerance_exits_2(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["steps", str(runs["a"]), str(runs["same"]), "--rtol", "-0.1"], capsys)
    assert err == "tracediff steps: error: rtol=-0.1: expected a finite number >= 0"


def test_no_shared_step_is_undecided(tmp_path: Path, runs: dict[str, Path],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path / "one", steps=[1])
    _run(tmp_path / "two", steps=[2])
    from tracediff.cli.main import main

    capsys.readouterr()
    code = main(["steps", str(tmp_path / "one"), str(tmp_path / "two")])
    out, err = capsys.readouterr()
    assert code == 1 and err == ("tracediff steps: undecided: no step recorded in both runs (A: 1; B: 2); record the "
                                 "same steps in both\n")
    assert "UNDECIDED: no step recorded in both runs" in out


def test_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["steps", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "tracediff steps runs/a runs/b --atol 1e-6 --format json" in out
    assert "exit codes:\n  0  identical or within tolerance\n  1  a divergence" in out
    assert "  3  internal error" in out
