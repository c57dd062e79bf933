"""The committed example traces in ``fixtures/`` (see fixtures/README.md), read and aligned as a user would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.alignment.helpers import run_cli
from tracediff import align, load_trace

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
LLAMA = FIXTURES / "llama_tiny"
BUG = "LlamaForCausalLM.model.layers.1.post_attention_layernorm"  # where fixtures/README.md says the bug is


@pytest.mark.parametrize("folder", ["llama_tiny/ref", "llama_tiny/port_bug", "llama_tiny/repr", "llama_tiny/native",
                                    "gpt2_tiny/ref", "bert_tiny/ref"])
def test_every_fixture_loads_and_its_payloads_read(folder: str) -> None:
    trace = load_trace(FIXTURES / folder)
    records = trace.records()
    assert records
    for _, record in records:
        if record.has_payload:
            assert tuple(trace.load(record).shape) == record.shape
        else:
            assert record.repr_lines or record.stale_reason


@pytest.mark.parametrize("reference", ["ref", "native", "repr"])
def test_the_documented_bug_is_the_first_divergence(reference: str) -> None:
    result = align(LLAMA / reference, LLAMA / "port_bug")
    first = result.first_divergence
    assert first is not None
    assert (first.module_path_a, first.module_path_b, first.tensor) == (BUG, BUG, "outputs")
    assert first.origin == "introduced" and first.approximate is (reference == "repr")
    assert all(row.within_tolerance is not False for row in result.rows[:first.order])
    downstream = {row.module_path_b.split(".")[-1] for row in result.rows[first.order:] if row.diverged}
    assert {"mlp", "norm", "lm_head"} <= downstream or {"down_proj", "norm", "lm_head"} <= downstream


@pytest.mark.parametrize("a, b", [("ref", "native"), ("native", "ref"), ("ref", "repr"), ("repr", "native")])
def test_the_same_run_written_three_ways_passes(a: str, b: str) -> None:
    result = align(LLAMA / a, LLAMA / b)
    assert result.passed and result.unmatched_a == () and result.unmatched_b == ()


def test_cli_on_the_fixtures(capsys: Any) -> None:
    code, out, err = run_cli(["align", str(LLAMA / "ref"), str(LLAMA / "port_bug"), "--format", "json"], capsys)
    assert (code, err) == (1, "")
    first = json.loads(out)["first_divergence"]
    assert (first["module_path_b"], first["call_index"], first["tensor"]) == (BUG, 0, "outputs")
