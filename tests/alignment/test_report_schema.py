"""``docs/schema/report.json`` describes what ``tracediff align --format json`` really writes."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.safety.helpers import cli
from tracediff.alignment.result import FORMAT_VERSION, TABLE_COLUMNS

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "schema" / "report.json").read_text())
FIXTURES = ROOT / "fixtures"


def _validate(report: dict[str, object]) -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.Draft202012Validator(SCHEMA).validate(report)


@pytest.mark.parametrize(("a", "b", "code"), [
    ("llama_tiny/ref", "llama_tiny/port_bug", 1),  # transformers' traces, a divergence
    ("llama_tiny/ref", "llama_tiny/native", 0),  # a tracediff trace against a standard one, passing
    ("msprobe/clean", "msprobe/scaled_weight", 1),  # imported dumps: ops, backward rows, importer_a/_b
    ("msprobe/clean_statistics", "msprobe/scaled_weight_statistics", 1),  # statistics only: approximate rows
])
def test_real_reports_follow_the_schema(a: str, b: str, code: int, capsys: pytest.CaptureFixture[str]) -> None:
    exit_code, out, _ = cli(["align", str(FIXTURES / a), str(FIXTURES / b), "--format", "json"], capsys)
    report = json.loads(out)
    assert exit_code == code and report["passed"] is (code == 0)
    _validate(report)
    if code:
        assert report["first_divergence"] is not None and report["rows"]


def test_a_report_that_breaks_the_schema_is_caught(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = cli(["align", str(FIXTURES / "llama_tiny/ref"), str(FIXTURES / "llama_tiny/port_bug"),
                     "--format", "json"], capsys)
    report = json.loads(out)
    report["rows"][0]["within_tolerance"] = "yes"
    with pytest.raises(jsonschema.ValidationError):
        _validate(report)


def test_the_schema_lists_every_key_of_the_report_and_of_a_row() -> None:
    from tracediff.alignment.result import Alignment

    empty = Alignment(trace_a="a", trace_b="b", model_a="A", model_b="B", rows=())
    assert SCHEMA["required"] == list(empty.to_dict())
    assert sorted(SCHEMA["$defs"]["row"]["required"]) == sorted(TABLE_COLUMNS)
    assert SCHEMA["properties"]["format_version"] == {"const": FORMAT_VERSION}
