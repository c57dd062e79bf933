"""``tracediff replay TRACE_A SPEC_B``: exit codes, the JSON contract, every output format."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tracediff
from tests.replaying import ports
from tracediff.cli.main import main

SPECS = "tests.replaying.ports"


@pytest.fixture(scope="module")
def llama_ref(capture_ref):  # type: ignore[no-untyped-def]
    return str(capture_ref("llama-fp32-eager", ports.llama, input_ids=ports.IDS))


def test_a_replay_that_compares_nothing_exits_2_naming_why(llama_ref: str, capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    assert main(["replay", llama_ref, f"{SPECS}:elsewhere"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("tracediff replay: warning")]
    assert len(err) == 1 and f"{SPECS}:elsewhere: nothing comparable:" in err[0]


def test_a_clean_port_exits_0(llama_ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", llama_ref, f"{SPECS}:exact_llama"]) == 0
    out = capsys.readouterr().out
    assert "PASSED: no culprit" in out and "replayed 45 module calls, skipped 0" in out


def test_culprits_exit_1_and_the_json_keeps_its_contract(llama_ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", llama_ref, f"{SPECS}:two_bugs_llama", "--format", "json", "--patch"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["format_version"] == 1 and report["passed"] is False
    culprits = report["culprits"]
    assert [c["module_path_b"] for c in culprits] == ["LlamaForCausalLM.model.layers.0.input_layernorm",
                                                      "LlamaForCausalLM.model.layers.2.mlp.down_proj"]
    for entry in culprits:
        assert {"module_path_a", "module_path_b", "call_index", "local_max_abs_err", "verdict"} <= set(entry)
        assert entry["verdict"] == "B differs" and 0 <= entry["patch_effect"] <= 100
    assert len(report["modules"]) == 45
    for entry in report["modules"]:
        assert {"module_path_a", "module_path_b", "call_index", "local_max_abs_err", "verdict", "precision_noise",
                "math_diff", "factor"} <= set(entry)
    assert report["skipped"] == []


def test_other_formats(llama_ref: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["replay", llama_ref, f"{SPECS}:two_bugs_llama", "--modules", "model.layers.2.mlp.**", "--no-oracle"]
    assert main([*args, "--format", "csv", "-o", str(tmp_path / "r.csv")]) == 1
    header = (tmp_path / "r.csv").read_text().splitlines()[0].split(",")
    assert header[:4] == ["order", "module_path_a", "module_path_b", "call_index"] and "verdict" in header
    assert main([*args, "--format", "markdown"]) == 1
    markdown = capsys.readouterr().out
    assert re.search(r"\| LlamaForCausalLM\.model\.layers\.2\.mlp\.down\\?_proj +\| 0 ", markdown), markdown
    assert main([*args, "--format", "html", "-o", str(tmp_path / "r.html")]) == 1
    page = (tmp_path / "r.html").read_text()
    assert page.startswith("<!doctype html>") and "down_proj" in page and "http" not in page


def test_html_shows_the_end_to_end_error_next_to_the_local_error(llama_ref: str, tmp_path: Path) -> None:
    port = ports.two_bugs_llama()
    with torch.no_grad(), tracediff.capture(port, tmp_path / "port"):
        port(input_ids=ports.IDS)
    out = tmp_path / "r.html"
    assert main(["replay", llama_ref, f"{SPECS}:two_bugs_llama", "--trace-b", str(tmp_path / "port"),
                 "--format", "html", "-o", str(out)]) == 1
    assert "end-to-end max abs (align)" in out.read_text()


@pytest.mark.parametrize(("args", "message"), [
    (["{ref}", f"{SPECS}:not_a_model"], "must return a torch.nn.Module or (model, inputs), got int"),
    (["{ref}", f"{SPECS}:missing"], "has no function 'missing'"),
    (["{ref}/nowhere", f"{SPECS}:exact_llama"], "no such trace folder or file"),
    (["{ref}", f"{SPECS}:exact_llama", "--device", "warp9"], "not a torch device"),
    (["{ref}", f"{SPECS}:exact_llama", "--atol", "-1"], "expected a finite number >= 0"),
    (["{ref}", f"{SPECS}:exact_llama", "--modules", "no.such.*"], "matches no replayable module call"),
])
def test_bad_input_exits_2_with_one_line(llama_ref: str, args: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", *[a.format(ref=llama_ref) for a in args]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tracediff replay: error: ") and message in err


def test_help_imports_nothing_heavy() -> None:
    code = ("import sys; from tracediff.cli.main import main\n"
            "try:\n    main(['replay', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert not {'torch', 'pandas', 'transformers'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_library_name_is_public() -> None:
    assert tracediff.replay.__module__ == "tracediff.replaying.engine"
    assert "replay" in tracediff.__all__ and "Replay" in tracediff.__all__


def test_match_reaches_the_pairing(capture_ref, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    ref = str(capture_ref("net", ports.net, ports.toy_input()))
    assert main(["replay", ref, f"{SPECS}:renamed_leaky_net", "--format", "json"]) == 1
    assert [c["module_path_b"] for c in json.loads(capsys.readouterr().out)["culprits"]] == ["RenamedNet.layers.1"]
    main(["replay", ref, f"{SPECS}:renamed_leaky_net", "--match", "name", "--format", "json"])
    assert not any(".layers." in m["module_path_b"] for m in json.loads(capsys.readouterr().out)["modules"])
