"""The machinery of the real-port suite (issue 22): build both sides, plant a bug, capture, align, judge.

A ``Port`` says how to build the reference (A) from a config with seeded random weights, how to convert
its weights with the conversion code or key naming of the project that owns the port, how to build the
port (B) from the converted weights, how to run each side, and which bugs porters really make. A
``PortRun`` captures every trace it needs once into a folder (under ``torch.no_grad()``, same inputs on
both sides) and answers one question per case: in this mode, does ``tracediff align`` give the right
verdict (exit code, and for a bug the module that holds it)?

The modes:

- ``no map``: ``tracediff align A B``;
- ``suggested map``: ``align A B_clean --suggest-map FILE`` once, then ``align A B --map FILE``;
- ``hand map``: ``align A B --map HAND`` (the port's hand-written rename rules, ``--match auto``);
- ``hand map + name``: ``align A B --map HAND --match name``.

A bf16 case casts the converted port to bfloat16 and adds ``--baseline`` (the reference cast to
bfloat16); it is right when it passes. A bug is never right in a mode where the clean port already
diverges: there the bug's verdict is the clean port's. ``replay`` and ``ops`` are asked of one bug per port, with the
hand map. A bug is located right when the first divergence (or the first culprit of a replay) is the expected
module or a module inside it, or when the report names the expected module as the likely source (a call of B
with no partner whose outputs feed the first divergence: docs/verdicts.md). The expected module is the
smallest module holding every weight or setting the bug edits: ``k_proj`` for one weight, ``self_attn`` for
``k_proj`` and ``v_proj`` swapped (either projection locates it), ``blocks.1.attn`` for transformer-lens's
``W_Q`` (its hook point ``blocks.1.attn.hook_q`` locates it too). ``ops`` records op nodes only inside the
module
holding the bug on each side (``Port.ops_in``, the two-step recipe of docs/ops.md).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tracediff
from tracediff.cli.main import main as cli_main

INSTALL = 'pip install -c constraints.txt -e ".[ports]"'
MODES = ("no map", "suggested map", "hand map", "hand map + name")
UNMAPPED = ("no map", "suggested map")
CLEAN = "clean"
BF16 = "bf16"

StateDict = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Bug:
    """A conversion mistake: an edit of the converted state dict, or of the built port, and where it lands.

    ``module`` is B's module path relative to the root (the root's class name left out).
    """

    name: str
    what: str
    module: str
    edit_state: Callable[[StateDict], None] | None = None
    edit_port: Callable[[nn.Module], None] | None = None


@dataclass(frozen=True)
class Port:
    """Both sides of one real port, from configs with seeded random weights (nothing downloaded)."""

    name: str
    reference: Callable[[], nn.Module]
    convert: Callable[[nn.Module], StateDict]
    port: Callable[[StateDict], nn.Module]
    run_reference: Callable[[nn.Module], Any]
    run_port: Callable[[nn.Module], Any]
    hand_map: dict[str, Any]
    bugs: tuple[Bug, ...]
    replay_bug: str
    ops_bug: str
    ops_in: tuple[str, str]
    bf16_reference: Callable[[nn.Module], nn.Module] = field(default=lambda model: model.to(torch.bfloat16))

    def bug(self, name: str) -> Bug:
        return next(bug for bug in self.bugs if bug.name == name)


@dataclass(frozen=True)
class Outcome:
    """What one run said, and whether that was right."""

    port: str
    case: str
    mode: str
    exit_code: int
    module: str | None
    expected_exit: int
    expected_module: str | None
    right: bool
    note: str = ""


def relative(path: str | None) -> str | None:
    """A recorded module path without its root class name (``LlamaForCausalLM.model.norm`` -> ``model.norm``)."""
    if path is None:
        return None
    return path.split(".", 1)[1] if "." in path else ""


def inside(module: str | None, expected: str) -> bool:
    return module is not None and (module == expected or module.startswith(expected + "."))


def spread_scales(model: nn.Module, *, biases: bool = False) -> nn.Module:
    """torchtune's RMSNorm scales (and, with ``biases``, every bias) start at one and zero: make them count."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("scale"):
                param.uniform_(0.5, 1.5)
            elif biases and name.endswith("bias"):
                param.uniform_(-0.5, 0.5)
    return model


def spread_norms(model: nn.Module) -> nn.Module:
    """transformers' RMSNorm weights start at one: make them count (an eps or a norm mistake must show)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
    return model


def export_only_offset(exporting: Callable[[], bool]) -> Callable[[nn.Module], None]:
    """An edit: layer 1's MLP adds 0.5 to its output, but only while ``exporting()`` (the exporter's own flag,
    ``torch.onnx.is_in_onnx_export`` or ``torch.compiler.is_exporting``) says so."""
    def edit(model: nn.Module) -> None:
        mlp = model.model.layers[1].mlp
        forward = mlp.forward

        def exported_differently(x: torch.Tensor) -> torch.Tensor:
            out = forward(x)
            return out + 0.5 if exporting() else out

        mlp.forward = exported_differently
    return edit


def spread_layernorms(model: nn.Module) -> nn.Module:
    """transformers' LayerNorms start at one and zero, its biases at zero: make them count."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layernorm" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                param.uniform_(-0.5, 0.5)
    return model


# torchtune's decoder names (A) as transformers' Llama-family names (B): the hand map of every torchtune port
TORCHTUNE_RENAMES = [
    ["^tok_embeddings$", "model.embed_tokens"],
    ["^norm$", "model.norm"],
    ["^output$", "lm_head"],
    ["^layers(?=\\.|$)", "model.layers"],
    ["^(model\\.layers\\.\\d+\\.)attn(?=\\.|$)", "\\1self_attn"],
    ["\\.output_proj$", ".o_proj"],
    ["\\.sa_norm$", ".input_layernorm"],
    ["\\.mlp_norm$", ".post_attention_layernorm"],
    ["\\.mlp\\.w1$", ".mlp.gate_proj"],
    ["\\.mlp\\.w3$", ".mlp.up_proj"],
    ["\\.mlp\\.w2$", ".mlp.down_proj"],
    ["\\.mlp\\.activation$", ".mlp.act_fn"],
]


def rms_eps(eps: float) -> Callable[[nn.Module], None]:
    """An edit setting the eps of every layer norm of a transformers decoder (``model.layers``) to ``eps``."""
    def edit(model: nn.Module) -> None:
        for layer in model.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.variance_epsilon = eps

    return edit


def o_proj_transposed(layer: int) -> Bug:
    """Layer ``layer``'s square ``o_proj`` weight transposed, in a transformers decoder's state dict."""
    key = f"model.layers.{layer}.self_attn.o_proj.weight"
    return Bug("o-proj-transposed", f"layer {layer}'s o_proj weight (square) transposed",
               f"model.layers.{layer}.self_attn.o_proj",
               edit_state=lambda s: s.__setitem__(key, s[key].t().contiguous()))


def swap(state: StateDict, first: str, second: str) -> None:
    state[first], state[second] = state[second].clone(), state[first].clone()


@dataclass
class PortRun:
    """Every trace and verdict of one port, captured lazily into ``root`` and kept for the session."""

    port: Port
    root: Path
    _traces: dict[str, Path] = field(default_factory=dict)
    _clean: dict[str, Outcome] = field(default_factory=dict)
    _likely: dict[tuple[str, str], str | None] = field(default_factory=dict)

    # --- models ------------------------------------------------------------------------------------------

    def reference_model(self) -> nn.Module:
        torch.manual_seed(0)
        return self.port.reference().eval()

    def port_model(self, case: str) -> nn.Module:
        state = {key: value.detach().clone() for key, value in self.port.convert(self.reference_model()).items()}
        bug = None if case in (CLEAN, BF16) else self.port.bug(case)
        if bug is not None and bug.edit_state is not None:
            with torch.no_grad():
                bug.edit_state(state)
        model = self.port.port(state).eval()
        if bug is not None and bug.edit_port is not None:
            with torch.no_grad():
                bug.edit_port(model)
        return model.to(torch.bfloat16) if case == BF16 else model

    # --- traces ------------------------------------------------------------------------------------------

    def trace(self, case: str, *, ops: bool = False) -> Path:
        """``reference``, ``reference-bf16``, ``clean``, ``bf16`` or a bug's name; ``ops`` adds op nodes."""
        key = f"{case}-ops" if ops else case
        if key not in self._traces:
            out = self.root / self.port.name / key
            if out.exists():
                shutil.rmtree(out)
            if case.startswith("reference"):
                model = self.reference_model()
                run = self.port.run_reference
                if case == "reference-bf16":
                    model = self.port.bf16_reference(model)
            else:
                model = self.port_model(case)
                run = self.port.run_port
            ops_in = self.port.ops_in[0 if case.startswith("reference") else 1] if ops else ()
            with torch.no_grad(), tracediff.capture(model, out, ops=ops, ops_in=ops_in):
                run(model)
            self._traces[key] = out
        return self._traces[key]

    def hand_map_file(self) -> Path:
        path = self.root / self.port.name / "hand-map.json"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.port.hand_map, indent=1))
        return path

    def suggested_map_file(self) -> Path | None:
        """The map ``--suggest-map`` writes for the clean port, or None when it wrote none."""
        path = self.root / self.port.name / "suggested-map.json"
        if not path.exists():
            self.cli(["align", str(self.trace("reference")), str(self.trace(CLEAN)), "--suggest-map", str(path)])
        return path if path.exists() else None

    # --- runs --------------------------------------------------------------------------------------------

    def cli(self, argv: list[str]) -> tuple[int, str]:
        """``tracediff ARGV`` in-process: the exit code and stdout."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(argv)
        return code, out.getvalue() + err.getvalue()

    def align(self, case: str, mode: str, *, ops: bool = False) -> tuple[int, str | None, str]:
        """Run ``tracediff align`` for one case in one mode: exit code, first divergence's module (B's, relative)."""
        reference = "reference-bf16" if case == BF16 else "reference"
        argv = ["align", str(self.trace("reference", ops=ops)), str(self.trace(case, ops=ops))]
        note = ""
        if mode == "suggested map":
            suggested = self.suggested_map_file()
            if suggested is None:
                note = "no map suggested"
            else:
                argv += ["--map", str(suggested)]
        elif mode in ("hand map", "hand map + name"):
            argv += ["--map", str(self.hand_map_file())]
            if mode == "hand map + name":
                argv += ["--match", "name"]
        if case == BF16:
            argv += ["--baseline", str(self.trace(reference))]
        report = self.root / self.port.name / "report.json"
        code, output = self.cli([*argv, "--format", "json", "--output", str(report)])
        if code not in (0, 1):
            return code, None, output.strip().splitlines()[-1] if output.strip() else note
        written = json.loads(report.read_text())
        first, likely = written["first_divergence"], written.get("likely_source")
        module = relative(first["module_path_b"]) if first else None
        if first and first.get("op"):
            note = f"op {first['op']}"
        if likely:  # the unpaired call of B feeding the first divergence, named as the likely source
            self._likely[case, mode] = relative(likely["module_path_b"])
        return code, module, note

    def located(self, case: str, mode: str, module: str | None, expected: str) -> tuple[bool, str]:
        """Does the verdict name the expected module: the first divergence, or else the likely source (a call
        of B with no partner feeding it, docs/verdicts.md)? With the note saying which."""
        if inside(module, expected):
            return True, ""
        likely = self._likely.get((case, mode))
        return inside(likely, expected), f"likely source `{likely}`" if likely else ""

    def judge(self, case: str, mode: str) -> Outcome:
        """One cell of the table: the run, and whether its verdict is right."""
        if mode in ("replay", "ops"):
            return self._judge_extra(case, mode)
        if case == CLEAN and mode in self._clean:
            return self._clean[mode]
        code, module, note = self.align(case, mode)
        if case == CLEAN:
            self._clean[mode] = Outcome(self.port.name, case, mode, code, module, 0, None, code == 0, note)
            return self._clean[mode]
        if case == BF16:
            return Outcome(self.port.name, case, mode, code, module, 0, None, code == 0, note)
        expected = self.port.bug(case).module
        found, likely = self.located(case, mode, module, expected)
        right = code == 1 and found
        note = "; ".join(filter(None, [note, likely]))
        if right and self.judge(CLEAN, mode).exit_code != 0:
            right, note = False, "the clean port diverges too"
        return Outcome(self.port.name, case, mode, code, module, 1, expected, right, note)

    def _judge_extra(self, case: str, mode: str) -> Outcome:
        expected = self.port.bug(case).module
        if mode == "ops":
            code, module, note = self.align(case, "hand map", ops=True)
            found, likely = self.located(case, "hand map", module, expected)
            right = code == 1 and found
            note = "; ".join(filter(None, [note, likely]))
            if right and self.judge(CLEAN, "hand map").exit_code != 0:
                right, note = False, "the clean port diverges too"
            return Outcome(self.port.name, case, mode, code, module, 1, expected, right, note)
        try:
            result = tracediff.replay(self.port_model(case), self.trace("reference"), map=self.port.hand_map)
        except tracediff.TracediffError as error:   # bad input: exit 2, never a verdict
            return Outcome(self.port.name, case, mode, 2, None, 1, expected, False, str(error))
        culprit = relative(result.culprits[0].module_path_b) if result.culprits else None
        code = 2 if result.nothing_compared else 0 if result.passed else 1
        note = f"{len(result.culprits)} culprits, {len(result.skipped)} skipped"
        return Outcome(self.port.name, case, mode, code, culprit, 1, expected,
                       code == 1 and inside(culprit, expected), note)


def cases(port: Port) -> Iterator[tuple[str, str]]:
    """Every (case, mode) of a port, in table order."""
    for case in (CLEAN, *(bug.name for bug in port.bugs), BF16):
        for mode in MODES:
            yield case, mode
    yield port.replay_bug, "replay"
    yield port.ops_bug, "ops"


def wrong_in(cases: tuple[str, ...], modes: tuple[str, ...], reason: str) -> dict[tuple[str, str], str]:
    """The same reason for every (case, mode) of ``cases`` x ``modes``."""
    return {(case, mode): reason for case in cases for mode in modes}


def parametrized(port: Port, wrong: dict[tuple[str, str], str]) -> list[Any]:
    """The (case, mode) parameters of a port's test, each case tracediff gets wrong today marked xfail(strict).

    ``wrong`` maps (case, mode) to what goes wrong; the pairing rebuild of issue 22 turns those into
    failing XPASSes, to be moved to plain cases.
    """
    import pytest

    unknown = set(wrong) - set(cases(port))
    if unknown:
        raise ValueError(f"{port.name}: no such cases: {sorted(unknown)}")
    return [
        pytest.param(case, mode, id=f"{case}-{mode.replace(' ', '_')}",
                     marks=[pytest.mark.xfail(strict=True, reason=f"issue 22: {wrong[case, mode]}")]
                     if (case, mode) in wrong else [])
        for case, mode in cases(port)
    ]


def verdict_tests(port: Port, wrong: dict[tuple[str, str], str]) -> tuple[Any, Any]:
    """A port file's module-scoped ``run`` fixture and its ``test_verdict``, to bind at module level::

        run, test_verdict = verdict_tests(PORT, WRONG)
    """
    import pytest

    @pytest.fixture(scope="module")
    def run(tmp_path_factory: pytest.TempPathFactory) -> PortRun:
        return PortRun(port, tmp_path_factory.mktemp(port.name))

    @pytest.mark.parametrize(("case", "mode"), parametrized(port, wrong))
    def test_verdict(run: PortRun, case: str, mode: str) -> None:
        outcome = run.judge(case, mode)
        assert outcome.right, outcome

    return run, test_verdict


def hooked_transformer_config(hf_config: Any) -> Any:
    """transformer-lens's ``HookedTransformerConfig`` for a transformers config, by its own
    ``convert_hf_model_config`` (which reads a config folder; the tiny model has no tokenizer)."""
    import tempfile

    from transformer_lens import HookedTransformerConfig
    from transformer_lens.loading_from_pretrained import convert_hf_model_config

    with tempfile.TemporaryDirectory() as folder:
        hf_config.save_pretrained(folder)
        settings = convert_hf_model_config(folder)
    settings["tokenizer_name"] = None  # tokens go in directly
    return HookedTransformerConfig(**settings)


def hooked_transformer(config: Any, state: StateDict) -> nn.Module:
    """A ``HookedTransformer`` holding ``state`` as converted, every weight processing off."""
    from transformer_lens import HookedTransformer

    model = HookedTransformer(config)
    model.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                      fold_value_biases=False, refactor_factored_attn_matrices=False)
    return model


def hooked_exact_gelu(model: nn.Module) -> None:
    """A HookedTransformer's MLPs with the exact GELU in place of the activation the checkpoint wants."""
    for block in model.blocks:
        block.mlp.act_fn = torch.nn.functional.gelu


def hooked_norm_eps(eps: float) -> Callable[[nn.Module], None]:
    """An edit setting every norm of a HookedTransformer to ``eps``."""
    def edit(model: nn.Module) -> None:
        for name, module in model.named_modules():
            if name.endswith(("ln1", "ln2", "ln_final")):
                module.eps = eps

    return edit


def hooked_common_bugs(expect_eps: float) -> tuple[Bug, ...]:
    """The mistakes every transformer-lens port of a LayerNorm model is tried with: W_Q and W_K swapped in
    layer 0, layer 1's MLP input bias left at zero, every LayerNorm's eps 1e-2 instead of the config's
    ``expect_eps``, and layer 1's square output projection transposed into W_O."""
    return (
        Bug("qk-swapped", "layer 0's W_Q and W_K swapped", "blocks.0.attn",
            edit_state=lambda s: swap(s, "blocks.0.attn.W_Q", "blocks.0.attn.W_K")),
        Bug("mlp-bias-dropped", "layer 1's dense_h_to_4h bias not copied (zero)", "blocks.1.mlp",
            edit_state=lambda s: s.__setitem__("blocks.1.mlp.b_in", torch.zeros_like(s["blocks.1.mlp.b_in"]))),
        Bug("ln-eps", f"LayerNorm eps 1e-2 instead of the config's {expect_eps:g} (every layer norm)",
            "blocks.0.ln1", edit_port=hooked_norm_eps(1e-2)),
        Bug("o-transposed", "layer 1's dense (square) transposed into W_O", "blocks.1.attn",
            edit_state=hooked_w_o_transposed(1)),
    )


def hooked_w_o_transposed(layer: int) -> Callable[[StateDict], None]:
    """An edit of layer ``layer``'s ``W_O`` used transposed, as a square projection read without its transpose."""
    def edit(state: StateDict) -> None:
        key = f"blocks.{layer}.attn.W_O"
        heads, head_dim, dim = state[key].shape
        state[key] = state[key].reshape(heads * head_dim, dim).t().reshape(heads, head_dim, dim).contiguous()

    return edit
