"""Aligning generation traces step by step, and the generation-only bugs each named at step, position, module."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest
import torch

import tracediff
from tracediff.cli.main import main
from tracediff.errors import UsageError

from . import ports
from .conftest import capture_generation

Traces = Callable[[str], Path]


@pytest.mark.parametrize(("reference", "port", "step", "position", "module", "tensor", "origin"), [
    ("llama", "llama_rotary_offset", 1, 6, "LlamaForCausalLM.model.rotary_emb", "outputs.0", "introduced"),
    # the cache is an input of the attention that reads it: the prompt's keys (positions 0-5) read wrong
    ("llama", "llama_kv_transposed", 1, 0, "LlamaForCausalLM.model.layers.1.self_attn", "inputs.kwargs.cache.keys",
     "between modules"),
    ("llama", "llama_mask_off_by_one", 1, 6, "LlamaForCausalLM.model.layers.0.self_attn.o_proj", "inputs.args.0",
     "between modules"),
    ("mistral", "mistral_window_late", 3, 8, "MistralForCausalLM.model.layers.0", "inputs.kwargs.attention_mask",
     "between modules"),
    ("gpt2", "gpt2_position_offset", 1, 6, "GPT2LMHeadModel.transformer.wpe", "outputs", "introduced"),
])
def test_a_generation_only_bug_is_named_at_its_step_position_and_module(
        generation_traces: Traces, reference: str, port: str, step: int, position: int, module: str, tensor: str,
        origin: str) -> None:
    result = tracediff.align(generation_traces(reference), generation_traces(port))
    assert not result.passed
    assert result.steps is not None and result.steps.first_diverging_step == step
    assert result.steps.compared == tuple(range(ports.NEW_TOKENS))
    first = result.first_divergence
    assert first is not None
    assert (first.step, first.position, first.module_path_b, first.tensor, first.origin) == \
        (step, position, module, tensor, origin)
    assert all(row.passed for row in result.rows if row.step is not None and row.step < step)  # the prefill passes


def test_identical_generations_pass_step_by_step(generation_traces: Traces) -> None:
    result = tracediff.align(generation_traces("gpt2"), generation_traces("gpt2"))
    assert result.passed
    assert result.steps is not None and result.steps.diverged == () and result.steps.first_diverging_step is None
    assert {row.step for row in result.rows} == set(range(ports.NEW_TOKENS))
    assert all(row.pcc == 1.0 for row in result.rows if row.status == "identical" and row.dtype_b == "torch.float32")


def test_step_restricts_the_comparison_to_one_step(generation_traces: Traces) -> None:
    result = tracediff.align(generation_traces("mistral"), generation_traces("mistral_window_late"), step=3)
    assert result.steps is not None and result.steps.compared == (3,) and result.steps.selected == 3
    assert {row.step for row in result.rows} == {3}
    first = result.first_divergence
    assert first is not None and (first.step, first.position) == (3, 8)
    assert tracediff.align(generation_traces("mistral"), generation_traces("mistral_window_late"), step=2).passed


def test_a_step_that_does_not_exist_is_a_usage_error_naming_the_trace(generation_traces: Traces) -> None:
    folder = generation_traces("llama")
    with pytest.raises(UsageError) as caught:
        tracediff.align(folder, folder, step=5)
    assert str(caught.value) == f"{folder}: has no decode step 5; it holds decode steps 0-4"


def test_different_step_counts_align_the_common_steps_and_say_so(generation_traces: Traces, tmp_path: Path) -> None:
    short = tmp_path / "short"
    capture_generation(ports.llama(), short)  # five steps, then cut to three below
    tree_path = next(short.glob("*_FULL_TENSORS.json"))
    tree = json.loads(tree_path.read_text())
    tree["subsequent_calls"] = tree["subsequent_calls"][:2]
    tree_path.write_text(json.dumps(tree))
    result = tracediff.align(generation_traces("llama"), short)
    assert result.passed
    note = "A holds 5 decode steps and B 3: compared the 3 steps both hold (0-2)"
    assert result.steps is not None and result.steps.compared == (0, 1, 2) and result.steps.note == note
    assert note in result.warnings
    assert not result.unmatched_a


def test_the_cli_names_the_first_diverging_step(generation_traces: Traces, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["align", str(generation_traces("llama")), str(generation_traces("llama_rotary_offset"))])
    out = capsys.readouterr().out
    assert code == 1
    assert "decode steps: compared 0-4 (A holds 5, B 5); first diverging step 1 (4 of 5 steps diverge)" in out
    assert "FIRST DIVERGENCE (introduced): LlamaForCausalLM.model.rotary_emb (step 1, position 6) outputs.0" in out


def test_the_cli_refuses_a_step_that_does_not_exist(generation_traces: Traces,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    folder = generation_traces("llama")
    code = main(["align", str(folder), str(folder), "--step", "7"])
    assert code == 2
    assert capsys.readouterr().err.strip() == \
        f"tracediff align: error: {folder}: has no decode step 7; it holds decode steps 0-4"


def test_the_json_report_carries_steps_positions_and_logits(generation_traces: Traces, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    code = main(["align", str(generation_traces("gpt2")), str(generation_traces("gpt2_position_offset")),
                 "--format", "json", "-o", str(out)])
    report = json.loads(out.read_text())
    assert code == 1
    assert report["steps"]["first_diverging_step"] == 1 and report["steps"]["compared"] == [0, 1, 2, 3, 4]
    first = report["first_divergence"]
    assert (first["step"], first["position"], first["positions_beyond"]) == (1, 6, 1)
    assert {verdict["step"] for verdict in report["logits"]} == {0, 1, 2, 3, 4}
    assert all(set(row) >= {"pcc", "kl_max", "top1_agreement", "argmax_flips"} for row in report["rows"])
    schema = json.loads((Path(__file__).resolve().parents[2] / "docs" / "schema" / "report.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(report)


def test_the_html_report_shows_the_steps_and_the_logits_verdicts(generation_traces: Traces) -> None:
    result = tracediff.align(generation_traces("gpt2"), generation_traces("gpt2_position_offset"))
    page = result.to_html()
    assert '<section id="steps"><h2>Decode steps</h2><p>decode steps: compared 0-4 (A holds 5, B 5); first ' \
           "diverging step 1 (4 of 5 steps diverge)</p>" in page
    assert page.count("<td>GPT2LMHeadModel</td><td>outputs.logits</td>") == ports.NEW_TOKENS


def test_a_static_cache_generation_aligns_step_by_step(tmp_path: Path) -> None:
    for name, model in (("a", ports.llama()), ("same", ports.llama()), ("bug", ports.rotary_offset(ports.llama()))):
        with torch.no_grad(), tracediff.capture(model, tmp_path / name):
            model.generate(ports.prompt(), **ports.generate_kwargs(cache_implementation="static"))
    trace = tracediff.load_trace(tmp_path / "a")
    step1 = next(n for n in trace.nodes() if n.relative_path == "model.layers.1.self_attn" and n.call_index == 1)
    assert {r.slot for r in step1.tensors if "cache" in r.slot} == {"inputs.kwargs.cache.keys",
                                                                    "inputs.kwargs.cache.values"}
    assert tracediff.align(tmp_path / "a", tmp_path / "same").passed
    first = tracediff.align(tmp_path / "a", tmp_path / "bug").first_divergence
    assert first is not None and (first.step, first.module_path_b) == (1, "LlamaForCausalLM.model.rotary_emb")
