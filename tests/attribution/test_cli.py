"""``tracediff attribute`` in-process: the JSON report, the other formats, the exit codes and their one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracediff.cli.main import main

from . import spec
from .conftest import captured

SPEC = "tests.attribution.spec:int4_llama"


@pytest.fixture(scope="module")
def trace_a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, inputs = spec.float_llama()
    return captured(tmp_path_factory.mktemp("attribute"), model, inputs)


@pytest.fixture(scope="module")
def report(trace_a: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("torchao", reason="the ports extra installs torchao")
    out = tmp_path_factory.mktemp("report") / "rank.json"
    assert main(["attribute", str(trace_a), SPEC, "--format", "json", "-o", str(out), "--budget", "2"]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


def test_json_report_ranks_every_layer_most_costly_first(report: dict) -> None:
    assert report["format_version"] == 1
    assert report["final_error"]["metric"] == "logits KL" and report["final_error"]["value"] > 0
    ranking = report["ranking"]
    assert [r["module_path"] for r in ranking] != [] and {r["module_path"] for r in ranking} == {
        f"LlamaForCausalLM.model.layers.{i}" for i in range(3)}
    assert [r["rank"] for r in ranking] == [1, 2, 3]
    assert [r["share"] for r in ranking] == sorted((r["share"] for r in ranking), reverse=True)
    assert all(0 <= r["share"] <= 1 and r["local_error"] > 0 and r["call_index"] == 0 for r in ranking)
    assert [s["share"] for s in report["budget"]] == sorted(s["share"] for s in report["budget"])


def test_json_report_matches_its_schema(report: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(__file__).parents[2] / "docs" / "schema" / "attribution.json").read_text())
    jsonschema.validate(report, schema)


@pytest.mark.parametrize(("fmt", "expected"), [("table", "share of final error"), ("markdown", "| rank |"),
                                               ("csv", "rank,module_path,call_index"), ("html", "class=bar")])
def test_other_formats(fmt: str, expected: str, trace_a: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torchao", reason="the ports extra installs torchao")
    assert main(["attribute", str(trace_a), SPEC, "--format", fmt]) == 0
    assert expected in capsys.readouterr().out


def test_quanto_linears_pair_with_the_float_ones(trace_a: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("optimum.quanto", reason="optimum-quanto is in the ports extra")
    assert main(["attribute", str(trace_a), "tests.attribution.spec:qint8_llama", "--modules", "leaves",
                 "--format", "json"]) == 0
    ranking = json.loads(capsys.readouterr().out)["ranking"]
    quantized = [r for r in ranking if r["module_type"] == "QLinear"]
    assert len(quantized) == 3 * 7  # q, k, v, o, gate, up, down in each layer
    assert all(r["local_error"] > 0 for r in quantized)


def test_a_glob_that_matches_nothing_is_bad_input(trace_a: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attribute", str(trace_a), "tests.attribution.spec:float_llama", "--modules", "nowhere.*"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "tracediff attribute: error: --modules nowhere.*: matches no module call of LlamaForCausalLM"


def test_a_trace_without_payloads_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import tracediff

    model, inputs = spec.float_llama()
    with tracediff.capture(model, tmp_path / "summary", tensors="summary"):
        model(**inputs)
    assert main(["attribute", str(tmp_path / "summary"), "tests.attribution.spec:float_llama"]) == 2
    assert "holds no tensor payloads" in capsys.readouterr().err
