"""``tracediff show``: the call tree of transformers' traces and tracediff's, filtered, with NaN/Inf flagged."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
import torch

import tracediff
from tests.models import Containers, EmitAll, seeded, tiny_llama, toy_input
from tracediff.cli.main import main
from tracediff.errors import TraceFormatError, UsageError
from tracediff.render.tree import CSV_COLUMNS, render_csv, render_json, render_tree
from tracediff.show import TraceView, show_trace

transformers = pytest.importorskip("transformers")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
FIXTURE_TRACES = sorted({p.parent for p in FIXTURES.rglob("*_debug_tree_*.json")}) if FIXTURES.is_dir() else []


def _committed_or_fresh(name: str, tmp_path_factory: pytest.TempPathFactory, **options: object) -> Path:
    """``fixtures/llama_tiny/{name}`` when committed, else the same capture made now (2-layer tiny Llama)."""
    committed = FIXTURES / "llama_tiny" / name
    if any(committed.glob("*_debug_tree_FULL_TENSORS.json")):
        return committed
    folder = tmp_path_factory.mktemp(name)
    model, inputs = tiny_llama(layers=2)
    with torch.no_grad():
        if name == "native":
            with tracediff.capture(model, folder):
                model(**inputs)
        else:
            with transformers.model_addition_debugger_context(model, debug_path=str(folder), do_prune_layers=False,
                                                              **options):
                model(**inputs)
    return folder


@pytest.fixture(scope="module")
def hf_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama traced by transformers' own debugger, with safetensors payloads."""
    return _committed_or_fresh("ref", tmp_path_factory, use_repr=False)


@pytest.fixture(scope="module")
def hf_repr_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run traced by transformers' debugger with repr lines instead of payloads."""
    return _committed_or_fresh("repr", tmp_path_factory, use_repr=True)


@pytest.fixture(scope="module")
def native_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run captured by ``tracediff.capture``."""
    return _committed_or_fresh("native", tmp_path_factory)


def _nan_model() -> torch.nn.Module:
    return EmitAll([torch.tensor([1.0, 2.0]), torch.tensor([float("nan"), 1.0]),
                    torch.tensor([float("inf"), -float("inf"), 3.0]), torch.full((2,), float("nan"))])


def test_every_call_in_order_with_recorded_statistics(hf_trace: Path) -> None:
    trace = tracediff.load_trace(hf_trace)
    view = show_trace(hf_trace)
    assert [n.module_path for n in view.nodes] == [n.module_path for n in trace.nodes()]
    assert view.producer == "transformers" and view.model_name == "LlamaForCausalLM"
    assert view.total_calls == len(view.nodes)
    checked = 0
    for node, tensor in view.tensors:
        record = next(r for n in trace.nodes() if n.module_path == node.module_path for r in n.tensors
                      if r.slot == tensor.slot and r.order == tensor.order)
        assert tensor.shape == record.shape and tensor.dtype == record.dtype
        if record.has_payload and record.dtype == "torch.float32" and tensor.mean is not None:
            data = trace.load(record).double()
            # transformers prints statistics with 4 decimals in scientific notation.
            assert tensor.min == pytest.approx(data.min().item(), rel=1e-3, abs=1e-30)
            assert tensor.max == pytest.approx(data.max().item(), rel=1e-3, abs=1e-30)
            if math.isfinite(tensor.mean):
                assert tensor.mean == pytest.approx(data.mean().item(), rel=1e-3, abs=1e-6)
            checked += 1
    assert checked > 20


def test_native_statistics_are_exact_and_nothing_is_flagged(native_trace: Path) -> None:
    trace = tracediff.load_trace(native_trace)
    view = show_trace(trace)
    assert view.producer == "tracediff" and view.complete is True
    lm_head = next(n for n in view.nodes if n.relative_path == "lm_head")
    out = next(t for t in lm_head.tensors if t.slot == "outputs")
    record = next(r for n in trace.nodes() if n.relative_path == "lm_head" for r in n.tensors if r.slot == "outputs")
    data = trace.load(record).double()
    assert out.mean == pytest.approx(data.mean().item(), rel=1e-6)  # summed in float32
    assert out.std == pytest.approx(data.std().item(), rel=1e-6)
    assert (out.min, out.max) == (data.min().item(), data.max().item())
    assert view.nonfinite == [] and view.first_nonfinite is None
    assert render_tree(view).endswith("no NaN/Inf in the shown tensors\n")


def test_repr_trace_has_statistics_but_no_payloads(hf_repr_trace: Path) -> None:
    view = show_trace(hf_repr_trace)
    tensors = [t for _, t in view.tensors]
    assert tensors and not any(t.has_payload for t in tensors)
    assert sum(t.mean is not None for t in tensors) > len(tensors) // 2


def test_summary_file_alone(hf_trace: Path) -> None:
    (summary,) = hf_trace.glob("*_SUMMARY.json")
    view = show_trace(summary)
    assert view.summary_only and view.json_file == str(summary)
    assert "summary (statistics only)" in render_tree(view).splitlines()[0]


def test_path_glob_keeps_matches_their_subtrees_and_ancestors(hf_trace: Path) -> None:
    view = show_trace(hf_trace, path="model.layers.1.self_attn")
    shown = [(n.relative_path, n.context) for n in view.nodes]
    assert shown[:3] == [("", True), ("model", True), ("model.layers.1", True)]
    assert {p for p, context in shown if not context} == {
        "model.layers.1.self_attn", *(f"model.layers.1.self_attn.{x}" for x in ("q_proj", "k_proj", "v_proj",
                                                                                 "o_proj"))}
    assert all(not n.tensors for n in view.nodes if n.context)
    # The full path works too; '*' is one path segment, '**' any number (tracediff.globs).
    full = show_trace(hf_trace, path="LlamaForCausalLM.model.layers.1.self_attn")
    assert [n.module_path for n in full.nodes] == [n.module_path for n in view.nodes]
    mlps = show_trace(hf_trace, path="**.mlp")
    with pytest.raises(UsageError, match="no module path matches '\\*\\.mlp'"):  # '*' never crosses a dot
        show_trace(hf_trace, path="*.mlp")
    assert {n.relative_path for n in mlps.nodes if not n.context and n.name == "mlp"} == {
        "model.layers.0.mlp", "model.layers.1.mlp"}


def test_depth_counts_below_the_root_or_below_each_match(hf_trace: Path) -> None:
    top = show_trace(hf_trace, depth=1)
    assert [n.relative_path for n in top.nodes] == ["", "model", "lm_head"]
    assert [n.relative_path for n in show_trace(hf_trace, depth=0).nodes] == [""]
    layer = show_trace(hf_trace, path="model.layers.0", depth=1)
    below = [n.relative_path for n in layer.nodes if not n.context]
    assert below[0] == "model.layers.0"
    assert all(p.count(".") == 3 for p in below[1:]) and "model.layers.0.mlp" in below
    assert "model.layers.0.mlp.gate_proj" not in below


def test_no_match_names_the_trace_and_examples(hf_trace: Path) -> None:
    with pytest.raises(UsageError, match=r"no module path matches 'layers\.9\.\*'; paths look like: model, "):
        show_trace(hf_trace, path="layers.9.*")
    with pytest.raises(UsageError, match="depth=-1"):
        show_trace(hf_trace, depth=-1)


@pytest.mark.parametrize("producer", ["tracediff", "transformers"])
def test_nan_and_inf_are_flagged_and_the_first_is_named(producer: str, tmp_path: Path) -> None:
    model, x = _nan_model(), toy_input()
    if producer == "tracediff":
        with tracediff.capture(model, tmp_path):
            model(x)
    else:
        with transformers.model_addition_debugger_context(model, debug_path=str(tmp_path), use_repr=False):
            model(x)
    view = show_trace(tmp_path)
    flagged = {(n.relative_path, t.slot) for n, t in view.nonfinite}
    assert ("emitters.1", "outputs") in flagged and ("emitters.2", "outputs") in flagged
    assert ("emitters.0", "outputs") not in flagged
    assert view.first_nonfinite == "EmitAll.emitters.1 outputs"
    text = render_tree(view)
    assert "!NaN/Inf" in text
    assert text.rstrip().endswith("the first is EmitAll.emitters.1 outputs")
    if producer == "tracediff":  # counts are recorded, so they are shown
        assert "NaN/Inf (1 nan)" in text and "NaN/Inf (1 +inf, 1 -inf)" in text


def test_tree_text_is_indented_and_aligned(native_trace: Path) -> None:
    text = render_tree(show_trace(native_trace, path="model.layers.0.mlp"))
    lines = text.splitlines()
    assert lines[2].split() == ["module", "/", "tensor", "shape", "dtype", "mean", "std", "min", "max"]
    mlp = next(i for i, line in enumerate(lines) if line.strip().startswith("mlp  [LlamaMLP]"))
    assert lines[mlp].startswith("      mlp")  # depth 3
    gate = next(line for line in lines if line.strip().startswith("gate_proj  [Linear]"))
    assert gate.startswith("        gate_proj")
    tensor_lines = [line for line in lines if line.strip().startswith(("in ", "out"))]
    dtype_columns = {line.index("float32") for line in tensor_lines if "float32" in line}
    assert len(dtype_columns) == 1


def test_json_is_strict_and_csv_has_one_row_per_tensor(tmp_path: Path) -> None:
    model = _nan_model()
    with tracediff.capture(model, tmp_path):
        model(toy_input())
    view = show_trace(tmp_path)
    data = json.loads(render_json(view), parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert data["format_version"] == 1 and data["first_nonfinite"] == "EmitAll.emitters.1 outputs"
    outputs = {n["relative_path"]: n["tensors"][-1] for n in data["nodes"] if n["relative_path"].startswith("emi")}
    assert outputs["emitters.1"]["nan"] == 1 and outputs["emitters.1"]["mean"] == 1.0  # moments of finite values
    assert (outputs["emitters.2"]["min"], outputs["emitters.2"]["max"]) == ("-inf", "inf")
    assert outputs["emitters.3"]["mean"] is None and outputs["emitters.3"]["nan"] == 2  # NaN -> null
    rows = list(csv.DictReader(io.StringIO(render_csv(view))))
    assert len(rows) == len(view.tensors) and list(rows[0]) == CSV_COLUMNS
    assert [r["nonfinite"] for r in rows if r["slot"] == "outputs" and r["relative_path"].startswith("emitters")] \
        == ["False", "True", "True", "True"]


def test_values_of_non_tensor_arguments_are_shown(hf_trace: Path) -> None:
    view = show_trace(hf_trace, path="model.layers.0")
    layer = next(n for n in view.nodes if n.relative_path == "model.layers.0")
    assert dict(layer.values).get("inputs.kwargs.use_cache") == "False"
    assert "in kwargs.use_cache = False" in render_tree(view)


def test_cli_show_formats_and_errors(native_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(native_trace), "--depth", "1"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("LlamaForCausalLM: tracediff trace at ")
    assert "  model  [LlamaModel]" in out and "q_proj" not in out
    target = tmp_path / "mlp.csv"
    assert main(["show", str(native_trace), "--path", "**.mlp", "--format", "csv", "-o", str(target)]) == 0
    rows = list(csv.DictReader(target.open()))
    assert rows and all(".mlp" in r["module_path"] for r in rows)
    assert main(["show", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracediff show: error: ") and err.count("\n") == 1 and "missing" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["show", str(native_trace), "--depth", "-2"])
    assert exit_info.value.code == 2
    assert "-2 is negative" in capsys.readouterr().err


def test_containers_and_call_indices_are_named_relative_to_the_parent(tmp_path: Path) -> None:
    model = seeded(Containers)
    with tracediff.capture(model, tmp_path):
        model(toy_input())
    view = show_trace(tmp_path)
    names = {n.relative_path: n.name for n in view.nodes}
    assert names["blocks.0"] == "blocks.0" and names["blocks.0.0"] == "0" and names["heads.cls"] == "heads.cls"


@pytest.mark.skipif(not FIXTURE_TRACES, reason="no traces under fixtures/ yet")
@pytest.mark.parametrize("folder", FIXTURE_TRACES, ids=[str(p.relative_to(FIXTURES)) for p in FIXTURE_TRACES])
def test_committed_fixture_traces(folder: Path) -> None:
    try:
        view = show_trace(folder)
    except TraceFormatError as e:  # fixtures that are broken on purpose must fail with a one-line message
        assert "\n" not in str(e)
        return
    assert isinstance(view, TraceView) and view.nodes
    text = render_tree(view)
    assert text.count("\n") >= len(view.nodes)
    json.loads(render_json(view))


def test_backward_entries_follow_the_forward_tree(tmp_path: Path) -> None:
    from tests.models import Chain

    model, x = seeded(Chain), toy_input().requires_grad_()
    with tracediff.capture(model, tmp_path, backward=True):
        model(x).sum().backward()
    view = show_trace(tmp_path)
    assert [(n.phase, n.relative_path) for n in view.nodes] == [
        ("forward", ""), ("forward", "a"), ("forward", "b"), ("backward", ""), ("backward", "b"), ("backward", "a")]
    grad_a = next(n for n in view.nodes if n.phase == "backward" and n.relative_path == "a")
    assert [t.slot for t in grad_a.tensors] == ["grad_outputs.0", "grad_inputs.0"]
    text = render_tree(view)
    assert text.index("backward pass (gradients, in the order they arrived):") > text.index("  b  [Linear]")
    assert "  grad in 0" in text
    assert [n.relative_path for n in show_trace(tmp_path, depth=0).nodes] == ["", ""]
    rows = list(csv.DictReader(io.StringIO(render_csv(view))))
    assert {r["phase"] for r in rows} == {"forward", "backward"}
