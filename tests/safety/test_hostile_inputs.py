"""Crafted step records and rename maps, and inputs that used to take minutes: bounded, one line, or refused."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import deepdiff
import pytest
import torch
from torch import nn

import tracediff
from tests.safety.helpers import cli
from tracediff.alignment.verdicts.arguments import _describe
from tracediff.errors import UsageError
from tracediff.maps.rules import apply_rename, check_rename
from tracediff.maps.safety import compiled
from tracediff.steps import StepRecorder


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("steps") / "run"
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with StepRecorder(model, out, optimizer=opt) as rec:
        for _ in range(2):
            with rec.step({"x": torch.ones(2, 3)}):
                model(torch.ones(2, 3)).sum().backward()
                opt.step()
                opt.zero_grad()
    return out


def _edited(run: Path, tmp_path: Path, name: str, edit: Any) -> Path:
    copy = Path(shutil.copytree(run, tmp_path / "b"))
    path = copy / name
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return copy


@pytest.mark.parametrize("options,shown", [
    ({"checksums": "params"}, '{"checksums": "params"}'),
    ({"checksums": 3}, '{"checksums": 3}'),
    (5, "5"),
])
def test_steps_options_of_the_wrong_type_are_refused(options: Any, shown: str, run: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    b = _edited(run, tmp_path, "run.json", lambda meta: meta.__setitem__("options", options))
    code, _, err = cli(["steps", str(run), str(b)], capsys)
    assert code == 2 and err == (f"tracediff steps: error: {b / 'run.json'}: \"options\" must be an object whose "
                                 f"\"checksums\" is a list of group names; found {shown}\n")


def test_comparing_nothing_is_never_a_pass(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    b = _edited(run, tmp_path, "run.json", lambda meta: meta["options"].__setitem__("checksums", ["nothing"]))
    code, out, err = cli(["steps", str(run), str(b)], capsys)
    assert code == 1 and err == ("tracediff steps: undecided: nothing to compare (groups recorded by both runs: none; "
                                 "steps in both: 2); record the same groups (checksums=...) in both runs\n")
    assert "UNDECIDED" in out
    code, out, _ = cli(["steps", str(run), str(b), "--format", "json"], capsys)
    report = json.loads(out)
    assert (code, report["passed"], report["verdict"]) == (1, False, "undecided") and report["reason"]


@pytest.mark.parametrize("edit,problem", [
    (lambda r: r.update(__all_optimizer__="changed", groups={**r["groups"], "optimizer": {"state": "oops"}}),
     "malformed"),
    (lambda r: r.update(__all_optimizer__="changed", groups={**r["groups"], "optimizer": "oops"}), "malformed"),
    (lambda r: (r.update(__all_params__="changed"),
                next(iter(r["groups"]["params"].values())).update(stats=[1, 2], hash="changed")), "malformed"),
    (lambda r: (r.update(__all_params__="changed"),
                next(iter(r["groups"]["params"].values())).update(stats={"mean": 10 ** 400}, hash="changed")),
     "malformed"),
])
def test_malformed_step_entries_are_one_line(edit: Any, problem: str, run: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    b = _edited(run, tmp_path, "step=0/rank0.json", edit)
    code, _, err = cli(["steps", str(run), str(b), "--atol", "1e-3"], capsys)
    assert code in (1, 2) and "Traceback" not in err and err.count("\n") <= 1, err
    if code == 2:
        assert problem in err, err


@pytest.mark.parametrize("text,problem", [
    ("[" * 100_000 + "]" * 100_000, "cannot read the step record (maximum recursion depth"),
    ('{"step": ' + "1" * 5000 + "}", "cannot read the step record (Exceeds the limit (4300 digits)"),
])
def test_step_records_nested_too_deeply_or_with_huge_integers(text: str, problem: str, run: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    b = Path(shutil.copytree(run, tmp_path / "b"))
    (b / "step=0" / "rank0.json").write_text(text)
    code, _, err = cli(["steps", str(run), str(b)], capsys)
    assert code == 2 and problem in err and err.count("\n") == 1


def test_a_step_record_linking_outside_is_named_a_step_record(run: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    b = Path(shutil.copytree(run, tmp_path / "b"))
    record = b / "step=0" / "rank0.json"
    record.unlink()
    record.symlink_to(run / "step=0" / "rank0.json")
    code, _, err = cli(["steps", str(run), str(b)], capsys)
    assert code == 2 and err == (f"tracediff steps: error: {b}: step record 'step=0/rank0.json' links outside the "
                                 "folder; refused\n")


# --- rename rules --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule,message", [
    (["^([a-z0-9_.]+)+!$", "x"], "nests unbounded quantifiers (like (a+)+), which can take exponential time"),
    ([r"(\w*\.)*end", "x"], "nests unbounded quantifiers"),
    (["a{4294967295}", "x"], "does not compile (OverflowError: the repetition number is too large)"),
    (["(a)", r"\2"], r"replacement '\\2' is not valid for '(a)' (invalid group reference 2 at position 1)"),
    (["a", "x\\"], "replacement 'x\\\\' is not valid for 'a' (bad escape (end of pattern) at position 1)"),
])
def test_rename_rules_that_could_fail_or_hang_are_refused_up_front(rule: list[str], message: str) -> None:
    with pytest.raises(UsageError) as e:
        check_rename([rule], source="map.json")
    assert str(e.value).startswith("map.json: rule 0 ") and message in str(e.value)


def test_safe_forms_of_the_same_rules_are_accepted_and_fast() -> None:
    rules = check_rename([["^([a-z0-9_]++\\.?)+!$", "x"], [r"^(?>[a-z0-9_.]+)+!$", "y"],
                          [r"blocks\.(\d+)\.attn", r"layers.\1.self_attn"]], source="map")
    hostile = "a" * 5000 + "."
    started = time.perf_counter()
    assert apply_rename(hostile, rules) == hostile
    assert apply_rename("blocks.3.attn", rules) == "layers.3.self_attn"
    # Not a speed target: backtracking into the nested repeat on 5000 characters takes some 2**5000 steps, the
    # possessive and atomic forms microseconds; no machine, however slow or busy, turns the latter into a minute.
    assert time.perf_counter() - started < 60.0


def test_a_thousand_rename_rules_are_compiled_once() -> None:
    rules = check_rename([[rf"^block{i}\.(\w+)$", rf"layer{i}.\1"] for i in range(1000)], source="map")
    paths = [f"block{i}.mlp" for i in range(0, 1000, 5)]
    compiles = compiled.cache_info().misses
    renamed = [apply_rename(p, rules) for p in paths]
    assert renamed[3] == "layer15.mlp"
    assert compiled.cache_info().misses == compiles  # check_rename compiled each rule; applying compiles none


# --- bounded work --------------------------------------------------------------------------------------------


def _no_deepdiff(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("deepdiff called on a large value")


def test_long_non_tensor_values_are_diffed_in_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    a = list(range(100_000))
    b = list(a)
    b[17] = -1
    with monkeypatch.context() as patched:  # deepdiff's work grows with the whole value: never called on these
        patched.setattr(deepdiff, "DeepDiff", _no_deepdiff)
        assert _describe(a, b) == "differs (100000 elements, first difference at index 17: 17 vs -1)"
        assert _describe(a, a[:-1]) == "lengths differ: 100000 vs 99999 elements; equal up to index 99999"
        assert _describe({str(i): i for i in range(5000)}, {str(i): i + (i == 9) for i in range(5000)}) == \
            "differs (5000 entries, first difference at key '9': 9 vs 10)"
    assert "changed from 2 to 3" in _describe([1, 2], [1, 3])  # small values keep deepdiff's description


def test_the_html_report_is_linear_in_path_depth(small_trace: Path) -> None:
    from dataclasses import replace

    from tracediff.render.html import render_html

    result = tracediff.align(small_trace, small_trace)
    deep = "Small." + ".".join(f"m{i}" for i in range(100_000))
    rows = tuple(replace(row, module_path_b=deep if i == 0 else row.module_path_b)
                 for i, row in enumerate(result.rows))
    started = time.perf_counter()
    html = render_html(replace(result, rows=rows))
    # Not a speed target: work quadratic in a 100,000-part path is some 10**10 steps (minutes); linear work is
    # milliseconds, far under the bound on any machine, however busy.
    assert time.perf_counter() - started < 60.0 and "m99999" in html
