"""OpenVINO at its defaults: transformers (A) against its own ``ov.convert_model`` export (B), as users run both.

A stock transformers family (Llama, Qwen3, Gemma 3; tiny configs, 2 layers, seeded random weights, norm weights
spread so that they count) is converted with ``ov.convert_model(model, example_input={input_ids,
attention_mask})`` and saved as an IR with float32 weights; B is ``tracediff capture model.xml --inputs FILE``
and A is ``model(input_ids=ids, attention_mask=mask)`` under ``tracediff.capture`` (transformers' cache on).

* ``--precision f32``: a clean export passes ``tracediff align A B`` with zero options, and each planted mistake
  is named at its module of A.
* the plugin's default precision (bf16 on a CPU with AVX-512 bf16 or AMX: matrix products and attention round
  to bf16, every output float32): judged against A's run in bf16 (``--baseline``, the reference captured after
  ``model.to(torch.bfloat16)``), a clean export passes and each planted mistake is named at its module.

The mistakes: one layer's norm epsilon edited in the converted model (1e-6 -> 1.0), one weight constant scaled
by 1.25, and a branch taken only while exporting (``torch.jit.is_tracing()`` is true inside
``ov.convert_model``, which traces with TorchScript) where one layer's MLP swaps its activation for a ReLU.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

INSTALL = 'pip install -c constraints.txt -e ".[openvino]"'
ov = pytest.importorskip("openvino", reason=f"openvino is not installed: {INSTALL}")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (the test extra)")

import tracediff  # noqa: E402
from tests.ports.harness import CLEAN, inside, relative  # noqa: E402
from tracediff.cli.main import main as cli_main  # noqa: E402

SEQ = 8
COMMON = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 32}
TOKENS = torch.randint(0, 64, (1, SEQ), generator=torch.Generator().manual_seed(1))
LAYER = 1


@dataclass(frozen=True)
class Family:
    name: str
    config: str
    model: str
    settings: dict[str, Any]
    norm_offset: float = 0.0  # Gemma scales by 1 + weight: its weights are spread around 0, others' around 1

    def reference(self) -> torch.nn.Module:
        torch.manual_seed(0)
        config = getattr(transformers, self.config)(**COMMON, **self.settings)
        model = getattr(transformers, self.model)(config).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):  # ones (zeros for Gemma) at init: make each norm's scale count
                    param.uniform_(0.5 - self.norm_offset, 1.5 - self.norm_offset)
        return model


FAMILIES = (
    Family("llama", "LlamaConfig", "LlamaForCausalLM", {}),
    Family("qwen3", "Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
    Family("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM",
           {"head_dim": 8, "sliding_window": 4, "query_pre_attn_scalar": 8,
            "layer_types": ["sliding_attention", "full_attention"]}, norm_offset=1.0),
)


# --- planted mistakes -----------------------------------------------------------------------------------------


def norm_eps_edited(model: Any) -> None:
    """Layer 1's input norm: the epsilon constant under its square root set to 1.0 (exported 1e-6)."""
    import openvino.opset13 as ops

    prefix = f"__module.model.layers.{LAYER}.input_layernorm/"
    add = next(op for op in model.get_ordered_ops() if op.get_type_name() == "Add"
               and op.get_friendly_name().startswith(prefix)
               and any(t.get_node().get_type_name() == "Sqrt" for t in op.output(0).get_target_inputs()))
    port = next(i for i, value in enumerate(add.input_values()) if value.get_node().get_type_name() == "Constant")
    old = add.input_value(port).get_node()
    add.input(port).replace_source_output(ops.constant(old.get_data() * 0 + 1.0).output(0))


def down_proj_scaled(model: Any) -> None:
    """Layer 1's down projection weight constant scaled by 1.25."""
    import openvino.opset13 as ops

    name = f"self.model.layers.{LAYER}.mlp.down_proj.weight"
    weight = next(op for op in model.get_ordered_ops() if op.get_friendly_name() == name)
    weight.output(0).replace(ops.constant(weight.get_data() * 1.25).output(0))


def export_only_branch(model: torch.nn.Module) -> Callable[[], None]:
    """Layer 1's MLP takes an "export-friendly" activation, ReLU for its SiLU or GELU, while being traced (inside
    ov.convert_model) only; returns the undo."""
    mlp = model.model.layers[LAYER].mlp
    forward = mlp.forward

    def traced(x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_tracing():
            return forward(x)
        gate = mlp.gate_proj(x)
        return mlp.down_proj(torch.relu(gate) * mlp.up_proj(x))

    mlp.forward = traced
    return lambda: setattr(mlp, "forward", forward)


@dataclass(frozen=True)
class Mistake:
    name: str
    module: str  # where it must be named, in A's paths relative to the root
    edit_ir: Callable[[Any], None] | None = None
    edit_export: Callable[[torch.nn.Module], Callable[[], None]] | None = None


MISTAKES = (
    Mistake("norm-eps", f"model.layers.{LAYER}.input_layernorm", edit_ir=norm_eps_edited),
    Mistake("weight-scaled", f"model.layers.{LAYER}.mlp.down_proj", edit_ir=down_proj_scaled),
    Mistake("export-branch", f"model.layers.{LAYER}.mlp", edit_export=export_only_branch),
)
CASES = (CLEAN, *(mistake.name for mistake in MISTAKES))
LOWER = ()  # the plugin's default; on a CPU without bf16 that is f32 and this case equals --precision f32


def _cli(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli_main(argv)
    return code, out.getvalue()


@dataclass
class Export:
    """One family's reference traces, IRs and OpenVINO traces, made lazily into ``folder``."""

    family: Family
    folder: Path
    _made: dict[str, Path] = field(default_factory=dict)

    def inputs(self) -> Path:
        path = self.folder / "inputs.safetensors"
        if not path.is_file():
            from safetensors.torch import save_file

            self.folder.mkdir(parents=True, exist_ok=True)
            save_file({"kwargs.input_ids": TOKENS.contiguous(),
                       "kwargs.attention_mask": torch.ones_like(TOKENS).contiguous()}, str(path))
        return path

    def reference(self, dtype: torch.dtype = torch.float32) -> Path:
        key = f"reference-{dtype}"
        if key not in self._made:
            out = self.folder / key.replace("torch.", "")
            model = self.family.reference().to(dtype)
            with torch.no_grad(), tracediff.capture(model, out):
                model(input_ids=TOKENS, attention_mask=torch.ones_like(TOKENS))
            self._made[key] = out
        return self._made[key]

    def ir(self, case: str) -> Path:
        key = f"ir-{case}"
        if key in self._made:
            return self._made[key]
        mistake = next((m for m in MISTAKES if m.name == case), None)
        if mistake is not None and mistake.edit_ir is not None:
            model = ov.Core().read_model(str(self.ir(CLEAN)))
            mistake.edit_ir(model)
        else:
            torch_model = self.family.reference()
            undo = mistake.edit_export(torch_model) if mistake is not None and mistake.edit_export else None
            torch_model.config.use_cache = False  # TorchScript's tracer takes no cache object
            inputs = {"input_ids": TOKENS, "attention_mask": torch.ones_like(TOKENS)}
            model = ov.convert_model(torch_model, example_input=inputs)
            if undo is not None:
                undo()
        path = self.folder / f"{case}.xml"
        ov.save_model(model, str(path), compress_to_fp16=False)
        self._made[key] = path
        return path

    def trace(self, case: str, options: tuple[str, ...]) -> Path:
        key = f"ov-{case}-{'-'.join(options) or 'defaults'}"
        if key not in self._made:
            out = self.folder / key
            code, text = _cli(["capture", str(self.ir(case)), "--inputs", str(self.inputs()), "--out", str(out),
                               *options])
            assert code == 0, text
            self._made[key] = out
        return self._made[key]

    def align(self, case: str, options: tuple[str, ...], *extra: str) -> tuple[int, str | None, dict[str, Any]]:
        label = f"{'-'.join(options) or 'defaults'}{'-baseline' if '--baseline' in extra else ''}"
        report = self.folder / f"report-{case}-{label}.json"
        code, text = _cli(["align", str(self.reference()), str(self.trace(case, options)), *extra,
                           "--format", "json", "--output", str(report)])
        assert code in (0, 1), text
        data = json.loads(report.read_text())
        first = data["first_divergence"]
        return code, relative(first["module_path_a"]) if first else None, data


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Export]:
    root = tmp_path_factory.mktemp("openvino-export")
    return {family.name: Export(family, root / family.name) for family in FAMILIES}


def _params(slow_after: str = "llama") -> list[Any]:
    return [pytest.param(family.name, case, id=f"{family.name}-{case}",
                         marks=() if family.name == slow_after else pytest.mark.slow)
            for family in FAMILIES for case in CASES]


def _expect(code: int, module: str | None, case: str, text: Any) -> None:
    if case == CLEAN:
        assert code == 0 and module is None, text
    else:
        expected = next(m.module for m in MISTAKES if m.name == case)
        assert code == 1 and inside(module, expected), (module, expected, text)


@pytest.mark.parametrize(("family", "case"), _params())
def test_f32_zero_options(exports: dict[str, Export], family: str, case: str) -> None:
    code, module, data = exports[family].align(case, ("--precision", "f32"))
    _expect(code, module, case, data.get("first_divergence"))


@pytest.mark.parametrize(("family", "case"), _params())
def test_default_precision_against_a_bf16_baseline(exports: dict[str, Export], family: str, case: str) -> None:
    export = exports[family]
    baseline = export.reference(torch.bfloat16)
    code, module, data = export.align(case, LOWER, "--baseline", str(baseline))
    _expect(code, module, case, data.get("first_divergence"))


def test_the_default_precision_is_read_back(exports: dict[str, Export]) -> None:
    """What the default-precision cases test: the plugin's own hint, read back from the compiled model."""
    trace = exports["llama"].trace(CLEAN, LOWER)
    runtime = json.loads((trace / "tracediff_metadata.json").read_text())["runtime"]
    default = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    assert runtime["precision_hint"] is None and runtime["inference_precision"] == default, runtime
    assert list(runtime["weight_types"]) == ["f32"], runtime  # saved with compress_to_fp16=False


def test_bf16_by_default_is_said_first_and_no_module_is_blamed(exports: dict[str, Export]) -> None:
    export = exports["llama"]
    trace = export.trace(CLEAN, LOWER)
    if json.loads((trace / "tracediff_metadata.json").read_text()).get("compute_dtype") != "torch.bfloat16":
        pytest.skip("this CPU runs OpenVINO in f32 by default (no AVX-512 bf16 or AMX)")
    code, module, data = export.align(CLEAN, LOWER)
    assert "bfloat16" in data["warnings"][0] and module is None, (data["warnings"], module)


def test_export_branch_is_taken_while_tracing() -> None:
    """The branch the export-branch mistake plants is the one ov.convert_model takes: torch.jit.is_tracing()."""
    model = FAMILIES[0].reference()
    seen: list[bool] = []
    mlp = model.model.layers[LAYER].mlp
    forward = mlp.forward
    mlp.forward = lambda x: (seen.append(torch.jit.is_tracing()), forward(x))[1]
    model.config.use_cache = False
    ov.convert_model(model, example_input={"input_ids": TOKENS, "attention_mask": torch.ones_like(TOKENS)})
    assert True in seen, seen


def test_the_baseline_line_names_the_precision_b_computed_in(exports: dict[str, Export]) -> None:
    """B's tensors are float32 whatever OpenVINO computed in: the noise floor the console names is that of
    the precision the plugin ran (bf16 where the CPU has it), not float32's."""
    export = exports["llama"]
    trace = export.trace(CLEAN, LOWER)
    computed = json.loads((trace / "tracediff_metadata.json").read_text()).get("compute_dtype")
    code, text = _cli(["align", str(export.reference()), str(trace), "--baseline",
                       str(export.reference(torch.bfloat16))])
    named = (computed or "torch.float32").removeprefix("torch.")
    assert code == 0 and f"x the {named} noise floor" in text, text[-2000:]
