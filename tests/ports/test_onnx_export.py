"""transformers (A) against ONNX Runtime running torch's ONNX export of the same model object (B), zero options.

Llama, Qwen3 and Gemma 3 (tiny, two layers, float32, random weights with their norms spread so that a norm
mistake shows) are captured in eager transformers at its defaults (``model(input_ids=ids)``, the cache on),
exported with torch's dynamo exporter and its legacy one, and run by ONNX Runtime on the CPU. A clean export
passes at default tolerances at every optimization level ONNX Runtime has, and so does a graph whose module
scopes were stripped (metadata removed, nodes renamed: paired by values and dataflow). Export mistakes are named
at their module: a branch taken only while exporting (``torch.onnx.is_in_onnx_export()``) in layer 1's MLP, and
graphs edited after export (layer 1's RMSNorm epsilon changed, one of its weights scaled).

The export is of the logits only (``use_cache=False``: the exporters cannot return transformers' cache
object); the prefill computes the same values with the cache on or off. The legacy exporter needs an explicit
``attention_mask`` and makes ``logits_to_keep`` a graph input: exported as its default ``0`` it is traced as
a tensor, the index of the one position whose logits the graph computes, so it is exported as the positions to
keep (all of them) and fed by position.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
pytest.importorskip("onnxscript", reason="the onnx extra is not installed (torch's dynamo exporter needs it)")
transformers = pytest.importorskip("transformers")

import tracediff  # noqa: E402
from tests.ports.harness import export_only_offset, inside, relative, spread_norms  # noqa: E402
from tracediff.capturing.adapters.onnx_nodes import scope_of  # noqa: E402
from tracediff.cli.main import main  # noqa: E402

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=128, max_position_embeddings=64, head_dim=16)
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
            "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM")}
EXPORTERS = ("dynamo", "legacy")
LEVELS = (None, "disable", "basic", "extended")  # None: ONNX Runtime's default, all
SEQ = 8


#: A family checked at the defaults only (its own test below), with what its config needs beyond COMMON
MORE = {"phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0})}


def reference_model(family: str) -> torch.nn.Module:
    config_class, model_class, *extra = {**FAMILIES, **MORE}[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**COMMON, **(extra[0] if extra else {}))
    model = getattr(transformers, model_class)(config).eval()
    return spread_norms(model)


def token_ids() -> torch.Tensor:
    return torch.randint(0, COMMON["vocab_size"], (1, SEQ), generator=torch.Generator().manual_seed(1))


def export(model: torch.nn.Module, ids: torch.Tensor, exporter: str) -> Any:
    """``model`` exported by torch's ``exporter`` ("dynamo" or "legacy") as an ``onnx.ModelProto``."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            return torch.onnx.export(model, (ids,), kwargs={"use_cache": False}, dynamo=True,
                                     verbose=False).model_proto
        out = io.BytesIO()
        kwargs = {"attention_mask": torch.ones_like(ids), "use_cache": False,
                  "logits_to_keep": torch.arange(ids.shape[1])}  # every position (an int is traced as one)
        torch.onnx.export(model, (ids,), out, kwargs=kwargs, dynamo=False, input_names=["input_ids", "attention_mask"])
    return onnx.load_from_string(out.getvalue())


def onnx_inputs(ids: torch.Tensor, exporter: str) -> dict[str, torch.Tensor]:
    if exporter == "dynamo":
        return {"kwargs.input_ids": ids}
    return {"kwargs.input_ids": ids, "kwargs.attention_mask": torch.ones_like(ids),
            "args.2": torch.arange(ids.shape[1])}  # logits_to_keep, the graph's third input


class FamilyRun:
    """One family: its eager trace, and its exports captured by ONNX Runtime, each once, on demand."""

    def __init__(self, family: str, root: Path, patch: Callable[[torch.nn.Module], None] | None = None) -> None:
        self.family, self.root = family, root
        self.model = reference_model(family)
        if patch is not None:
            patch(self.model)
        self.ids = token_ids()
        self.reference = root / "hf"
        with tracediff.capture(self.model, self.reference):
            self.model(input_ids=self.ids)
        self._exports: dict[str, Any] = {}

    def exported(self, exporter: str) -> Any:
        if exporter not in self._exports:
            self._exports[exporter] = export(self.model, self.ids, exporter)
        return self._exports[exporter]

    def captured(self, exporter: str, name: str, proto: Any | None = None, level: str | None = None) -> Path:
        out = self.root / name
        options = {} if level is None else {"graph_optimization": level}
        session = tracediff.capture_file(proto if proto is not None else self.exported(exporter), out,
                                         inputs=onnx_inputs(self.ids, exporter), options=options)
        assert session.complete
        return out

    def align(self, trace: Path) -> tuple[int, str | None, str]:
        """``tracediff align hf/ onnx/``: the exit code, the first divergence's module of A, the output."""
        code, report, text = self.report(trace)
        first = report["first_divergence"] if report else None
        return code, relative(first["module_path_a"]) if first else None, text

    def report(self, trace: Path) -> tuple[int, dict[str, Any] | None, str]:
        """The exit code, the JSON report (None when there is none) and the output of ``tracediff align``."""
        report = trace.parent / f"{trace.name}-report.json"
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main(["align", str(self.reference), str(trace), "--format", "json", "--output", str(report)])
        return code, json.loads(report.read_text()) if code in (0, 1) else None, out.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, FamilyRun]:
    root = tmp_path_factory.mktemp("onnx-export")
    return {family: FamilyRun(family, root / family) for family in FAMILIES}


@pytest.mark.parametrize("level", LEVELS, ids=lambda level: level or "default")
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_clean_export_passes(runs: dict[str, FamilyRun], family: str, exporter: str, level: str | None) -> None:
    run = runs[family]
    code, module, text = run.align(run.captured(exporter, f"{exporter}-{level or 'default'}", level=level))
    assert code == 0, (module, text[-3000:])


def test_a_node_the_exporter_left_without_a_scope_is_read_inside_the_module_around_it(tmp_path: Path) -> None:
    """Phi-3's MLP splits its fused gate/up projection with ``chunk``: the dynamo exporter's ``Split`` carries no
    name scope, and read at the top it cut ``model`` into three calls that paired with nothing. It takes the
    scopes its neighbours share, the MLP's, and the export passes at the defaults."""
    run = FamilyRun("phi3", tmp_path)
    trace = run.captured("dynamo", "dynamo")
    splits = [node for node in tracediff.load_trace(trace).nodes() if node.module_type == "Split"]
    assert {node.scopes for node in splits} == {("model", f"model.layers.{i}", f"model.layers.{i}.mlp")
                                                 for i in range(COMMON["num_hidden_layers"])}
    code, module, text = run.align(trace)
    assert code == 0, (module, text[-3000:])


def strip_scopes(model: Any) -> Any:
    """A copy of ``model`` with every node's metadata removed and its name anonymised."""
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    for index, node in enumerate(stripped.graph.node):
        del node.metadata_props[:]
        node.name = f"n{index}"
    return stripped


@pytest.mark.parametrize("family", FAMILIES)
def test_a_graph_without_scopes_passes(runs: dict[str, FamilyRun], family: str) -> None:
    """Placed under A's modules by values and dataflow (tracediff/alignment/pairing/placed_by_values.py)."""
    run = runs[family]
    code, module, text = run.align(run.captured("dynamo", "stripped", strip_scopes(run.exported("dynamo"))))
    assert code == 0, (module, text[-3000:])
    assert "placed under A's modules by their values and dataflow" in text


def test_the_command_line_captures_an_export_and_aligns_it(runs: dict[str, FamilyRun], tmp_path: Path) -> None:
    run = runs["llama"]
    model_file, inputs = tmp_path / "model.onnx", tmp_path / "inputs.safetensors"
    onnx.save(run.exported("dynamo"), str(model_file))
    save_file({"kwargs.input_ids": run.ids}, str(inputs))
    assert main(["capture", str(model_file), "--inputs", str(inputs), "--out", str(tmp_path / "onnx")]) == 0
    assert main(["align", str(run.reference), str(tmp_path / "onnx")]) == 0


# --- export mistakes --------------------------------------------------------------------------------------------


#: Layer 1's MLP adds 0.5 to its output, but only while it is being exported
export_only_branch = export_only_offset(torch.onnx.is_in_onnx_export)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_branch_taken_only_while_exporting_is_named_at_its_module(tmp_path: Path, exporter: str) -> None:
    run = FamilyRun("llama", tmp_path, patch=export_only_branch)
    code, module, text = run.align(run.captured(exporter, "onnx"))
    assert code == 1 and inside(module, "model.layers.1.mlp"), (module, text[-3000:])


def _nodes_in(model: Any, scope: str, op: str) -> list[Any]:
    found = []
    for node in model.graph.node:
        chain, _, _ = scope_of(node)
        if node.op_type == op and chain and chain[-1] == scope:
            found.append(node)
    return found


def _constants(model: Any) -> set[str]:
    return {t.name for t in model.graph.initializer} | {
        out for node in model.graph.node if node.op_type == "Constant" for out in node.output}


def edited_epsilon(model: Any) -> Any:
    """Layer 1's input RMSNorm adds 0.5 instead of its epsilon to the mean of squares."""
    edited = onnx.ModelProto()
    edited.CopyFrom(model)
    (add,) = _nodes_in(edited, "model.layers.1.input_layernorm", "Add")
    index = next(i for i, name in enumerate(add.input) if name in _constants(edited))
    edited.graph.initializer.append(onnx.numpy_helper.from_array(np.array(0.5, dtype=np.float32), "planted_eps"))
    add.input[index] = "planted_eps"
    return edited


def scaled_weight(model: Any) -> Any:
    """Layer 1's up projection's weight scaled by 1.25."""
    edited = onnx.ModelProto()
    edited.CopyFrom(model)
    (matmul,) = _nodes_in(edited, "model.layers.1.mlp.up_proj", "MatMul")
    weights = {t.name: t for t in edited.graph.initializer}
    name = next(name for name in matmul.input if name in weights)
    scaled = onnx.numpy_helper.to_array(weights[name]) * np.float32(1.25)
    edited.graph.initializer.append(onnx.numpy_helper.from_array(scaled, "planted_weight"))
    matmul.input[list(matmul.input).index(name)] = "planted_weight"
    return edited


EDITS = {"epsilon": (edited_epsilon, "model.layers.1.input_layernorm"),
         "weight": (scaled_weight, "model.layers.1.mlp.up_proj")}


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("edit", EDITS)
def test_a_graph_edited_after_export_is_named_at_its_module(runs: dict[str, FamilyRun], edit: str,
                                                            exporter: str) -> None:
    run = runs["llama"]
    change, expected = EDITS[edit]
    code, module, text = run.align(run.captured(exporter, f"{edit}-{exporter}", change(run.exported(exporter))))
    assert code == 1 and inside(module, expected), (module, text[-3000:])


def accuracy_rows(root: Path) -> list[str]:
    """docs/accuracy.md's rows: every clean case's verdict and worst error, and every mistake's first divergence."""
    rows = []
    for family in FAMILIES:
        run = FamilyRun(family, root / family)
        cases = [(exporter, level, None) for exporter in EXPORTERS for level in LEVELS]
        cases += [("dynamo", None, "stripped")] + [(exporter, None, edit) for edit in EDITS for exporter in EXPORTERS
                                                    if family == "llama"]
        for exporter, level, case in cases:
            proto = None if case is None else strip_scopes(run.exported(exporter)) if case == "stripped" \
                else EDITS[case][0](run.exported(exporter))
            name = f"{exporter}-{level or 'all'}-{case or 'clean'}"
            code, report, _ = run.report(run.captured(exporter, name, proto, level=level))
            worst = max((r["max_abs_err"] for r in report["rows"] if r["max_abs_err"] is not None), default=None) \
                if report else None
            first = relative(report["first_divergence"]["module_path_a"]) if report and report["first_divergence"] \
                else ""
            compared = report["summary"]["compared"] if report else 0
            shown = "-" if worst is None else f"{worst:.2e}"
            rows.append(f"| {family} | {exporter} | {level or 'all (default)'} | {case or 'clean'} | exit {code}"
                        f"{', ' + first if first else ''} | {compared} | {shown} |")
    return rows


if __name__ == "__main__":  # python tests/ports/test_onnx_export.py: the rows of docs/accuracy.md's ONNX table
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        print("| family | exporter | optimization | case | verdict | tensors compared | worst max abs error |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(accuracy_rows(Path(folder))))
