"""transformers (A) against ExecuTorch running an export of the same model object (B), zero options.

Llama, Qwen2, Qwen3, Gemma 2 and Gemma 3 (tiny, two layers, float32, random weights with their norms spread so
that a norm mistake shows) are captured in eager transformers at its defaults (``model(input_ids=ids)``, the
cache on), exported with ``torch.export.export`` and ``executorch.exir.to_edge_transform_and_lower`` (portable
kernels, or with the XNNPACK partitioner) with an ETRecord, and run by ExecuTorch's pybinding with ETDump and
a debug buffer. A clean portable export passes at default tolerances. A branch taken only while exporting
(``torch.compiler.is_exporting()``) in layer 1's MLP is named at that MLP (portable) or, delegated to XNNPACK,
at the layer whose output the delegate hands out.

The export is of the logits only (``use_cache=False``: ``torch.export`` cannot return transformers' cache
object); the prefill computes the same values with the cache on or off. ``use_cache`` is then a constant of the
program, which the capture feeds from the program itself.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

pytest.importorskip("executorch.runtime", reason="executorch is not installed (see README: pip install --no-deps "
                    "executorch==1.5.1 and its requirements)")
transformers = pytest.importorskip("transformers")

import tracediff  # noqa: E402
from tests.ports.harness import export_only_offset, inside, relative, spread_norms  # noqa: E402
from tracediff.cli.main import main  # noqa: E402

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=128, max_position_embeddings=64, head_dim=16)
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
            "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
            "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM")}
SEQ = 8
def reference_model(family: str) -> torch.nn.Module:
    config_class, model_class = FAMILIES[family]
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**COMMON)).eval()
    return spread_norms(model)


def token_ids() -> torch.Tensor:
    return torch.randint(0, COMMON["vocab_size"], (1, SEQ), generator=torch.Generator().manual_seed(1))


def export(model: torch.nn.Module, ids: torch.Tensor, *, xnnpack: bool) -> Any:
    """``model`` exported to an ExecuTorch program manager, with its ETRecord (XNNPACK-delegated or not)."""
    from executorch.exir import to_edge_transform_and_lower

    partitioner = []
    if xnnpack:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner = [XnnpackPartitioner()]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        exported = torch.export.export(model, (), {"input_ids": ids, "use_cache": False})
        return to_edge_transform_and_lower(exported, partitioner=partitioner, generate_etrecord=True).to_executorch()


class FamilyRun:
    """One family: its eager trace, and its exports captured by ExecuTorch, each once, on demand."""

    def __init__(self, family: str, root: Path, patch: Callable[[torch.nn.Module], None] | None = None) -> None:
        self.family, self.root = family, root
        self.model = reference_model(family)
        if patch is not None:
            patch(self.model)
        self.ids = token_ids()
        self.reference = root / "hf"
        with tracediff.capture(self.model, self.reference):
            self.model(input_ids=self.ids)
        self._exports: dict[bool, Any] = {}

    def exported(self, xnnpack: bool = False) -> Any:
        if xnnpack not in self._exports:
            self._exports[xnnpack] = export(self.model, self.ids, xnnpack=xnnpack)
        return self._exports[xnnpack]

    def captured(self, name: str, xnnpack: bool = False) -> Path:
        out = self.root / name
        if out.exists():  # captured once per module, by whichever test asks first
            return out
        session = tracediff.capture_file(self.exported(xnnpack), out, inputs={"kwargs.input_ids": self.ids})
        assert session.complete
        return out

    def align(self, trace: Path) -> tuple[int, str | None, str]:
        """``tracediff align hf/ executorch/``: the exit code, the first divergence's module of A, the output."""
        report = trace.parent / f"{trace.name}-report.json"
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = main(["align", str(self.reference), str(trace), "--format", "json", "--output", str(report)])
        first = json.loads(report.read_text())["first_divergence"] if code in (0, 1) else None
        return code, relative(first["module_path_a"]) if first else None, out.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, FamilyRun]:
    root = tmp_path_factory.mktemp("executorch-export")
    return {family: FamilyRun(family, root / family) for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_clean_portable_export_passes(runs: dict[str, FamilyRun], family: str) -> None:
    run = runs[family]
    code, module, text = run.align(run.captured("portable"))
    assert code == 0, (module, text[-3000:])


def test_linear_outputs_are_compared_through_their_reshape(runs: dict[str, FamilyRun]) -> None:
    """A Linear's output is the 2-D ``mm`` (its view back to 3-D runs as no instruction): compared as it is."""
    run = runs["llama"]
    trace = run.captured("portable-layout")
    rows = tracediff.align(run.reference, trace).to_dict()["rows"]
    (q_proj,) = [row for row in rows if relative(row["module_path_b"]) == "model.layers.0.self_attn.q_proj"
                 and row["tensor_b"] == "outputs"]
    assert (q_proj["shape_a"], q_proj["shape_b"], q_proj["status"]) == ([1, SEQ, 64], [SEQ, 64], "close")
    assert q_proj["transform"] == f"A.reshape({SEQ},64) ~ B"  # a layout, said as one


def test_the_command_line_captures_a_program_and_aligns_it(runs: dict[str, FamilyRun], tmp_path: Path) -> None:
    run = runs["llama"]
    program, etrecord, inputs = tmp_path / "model.pte", tmp_path / "etrecord.bin", tmp_path / "inputs.safetensors"
    manager = run.exported()
    program.write_bytes(manager.buffer)
    manager.get_etrecord().save(str(etrecord))
    save_file({"kwargs.input_ids": run.ids}, str(inputs))
    assert main(["capture", str(program), "--etrecord", str(etrecord), "--inputs", str(inputs),
                 "--out", str(tmp_path / "et")]) == 0
    runtime = json.loads((tmp_path / "et" / "tracediff_metadata.json").read_text())["runtime"]
    assert (runtime["kernels"], runtime["delegates"]) == (["portable"], {})
    assert main(["align", str(run.reference), str(tmp_path / "et")]) == 0


# --- export mistakes --------------------------------------------------------------------------------------------


#: Layer 1's MLP adds 0.5 to its output, but only while it is being exported
export_only_branch = export_only_offset(torch.compiler.is_exporting)


@pytest.fixture(scope="module")
def mistaken(tmp_path_factory: pytest.TempPathFactory) -> FamilyRun:
    return FamilyRun("llama", tmp_path_factory.mktemp("executorch-mistake"), patch=export_only_branch)


def test_a_branch_taken_only_while_exporting_is_named_at_its_module(mistaken: FamilyRun) -> None:
    code, module, text = mistaken.align(mistaken.captured("portable"))
    assert code == 1 and inside(module, "model.layers.1.mlp"), (module, text[-3000:])


def test_a_mistake_inside_a_delegated_layer_is_named_at_the_delegates_boundary(mistaken: FamilyRun) -> None:
    """XNNPACK runs layer 1's MLP and its residual add in one delegate call: its output, the layer's, is the
    first value B shows after the mistake."""
    trace = mistaken.captured("xnnpack", xnnpack=True)
    code, module, text = mistaken.align(trace)
    runtime = json.loads((trace / "tracediff_metadata.json").read_text())["runtime"]
    assert runtime["kernels"] == ["portable", "xnnpack"] and "XnnpackBackend" in runtime["delegates"]
    assert code == 1 and module == "model.layers.1", (module, text[-3000:])


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_clean_xnnpack_export_passes(runs: dict[str, FamilyRun], family: str) -> None:
    """Delegated to XNNPACK: the calls whose values never leave a delegate (attention, the MLP) are judged
    through the layer outputs the delegates hand out, and those pass."""
    run = runs[family]
    trace = run.captured("xnnpack", xnnpack=True)
    runtime = json.loads((trace / "tracediff_metadata.json").read_text())["runtime"]
    assert "model.layers.0.mlp" in runtime["modules_not_shown"]
    code, module, text = run.align(trace)
    assert code == 0, (module, text[-3000:])


def report(trace: Path) -> dict[str, Any]:
    return json.loads((trace.parent / f"{trace.name}-report.json").read_text())


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_xnnpack_gelu_is_named_where_it_acts(runs: dict[str, FamilyRun], family: str) -> None:
    """Gemma delegated to XNNPACK: the graph asks for GELU's tanh form, XNNPACK computes the erf form (its
    GELU has no ``approximate``); amplified by the post-feedforward norm, the layer outputs differ by ~1e-3.
    The capture names the approximation on the delegate outputs it acts on; the alignment is undecided, says
    so first, and blames no module."""
    run = runs[family]
    trace = run.captured("xnnpack", xnnpack=True)
    declared = [item for node in tracediff.load_trace(trace).nodes()
                for item in (node.attributes or {}).get("approximations", [])]
    assert {item["scope"] for item in declared} == {"model.layers.0.mlp.act_fn", "model.layers.1.mlp.act_fn"}
    assert {(item["name"], item["approximate"]) for item in declared} == {("xnnpack_gelu_erf", "tanh")}
    code, module, text = run.align(trace)
    found = report(trace)
    assert code == 1 and found["verdict"] == "undecided" and not found["sources"], (module, text[-3000:])
    assert found["first_divergence"]["origin"] == "runtime approximation"
    assert "XNNPACK's GELU" in found["warnings"][0] and "model.layers.0.mlp.act_fn" in found["warnings"][0]


def test_a_reference_computing_the_kernels_gelu_passes(runs: dict[str, FamilyRun], tmp_path: Path) -> None:
    """The named cause, checked: the same Gemma 2 weights run eagerly with the erf GELU (what XNNPACK
    computes) agree with the XNNPACK program at the default tolerances."""
    run = runs["gemma2"]
    trace = run.captured("xnnpack", xnnpack=True)
    erf = reference_model("gemma2")
    for layer in erf.model.layers:
        layer.mlp.act_fn = torch.nn.GELU()
    with tracediff.capture(erf, tmp_path / "hf-erf"):
        erf(input_ids=run.ids)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["align", str(tmp_path / "hf-erf"), str(trace)])
    assert code == 0, out.getvalue()[-3000:]
