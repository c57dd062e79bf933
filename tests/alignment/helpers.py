"""Models, captures and trace edits shared by the reading, alignment and CLI tests.

Every model is built from a fixed seed, so two builds have bit-identical
weights; a "bug" is a deliberate change to one module of the second build.
Traces are written by transformers' own debugger
(``transformers.model_addition_debugger_context``) or by ``tracediff.capture``,
and cached for the whole test session by ``TraceStore`` (tests that edit a
trace work on a copy, see ``copy_trace``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tracediff

VOCAB = 100
INPUT_IDS = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(11))


def toy_input(rows: int = 3) -> torch.Tensor:
    return torch.randn(rows, 4, generator=torch.Generator().manual_seed(5))


# --- tiny transformers models -------------------------------------------------------------------------------


def llama(*, layers: int = 2, seed: int = 0) -> nn.Module:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=32, use_cache=False,
                         attn_implementation="eager")
    torch.manual_seed(seed)
    return LlamaModel(config).eval()


def gpt2(*, layers: int = 2, seed: int = 0) -> nn.Module:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_embd=32, n_layer=layers, n_head=4, vocab_size=VOCAB, n_positions=32, use_cache=False,
                        attn_implementation="eager")
    torch.manual_seed(seed)
    return GPT2Model(config).eval()


def bert(*, layers: int = 2, seed: int = 0) -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                        vocab_size=VOCAB, max_position_embeddings=32, attn_implementation="eager")
    torch.manual_seed(seed)
    return BertModel(config).eval()


# --- plain PyTorch models -----------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class RefModel(nn.Module):
    """embed -> three residual blocks (``layers.N.{norm,fc1,act,fc2}``) -> head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.layers = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class PortModel(RefModel):
    """The same submodule names under another class name."""


class RenamedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.up = nn.Linear(8, 16)
        self.relu = nn.ReLU()
        self.down = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.relu(self.up(self.ln(x))))


class RenamedPort(nn.Module):
    """RefModel's computation with every submodule renamed (``blocks.N.{ln,up,relu,down}``)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj_in = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([RenamedBlock() for _ in range(3)])
        self.proj_out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj_in(x)
        for block in self.blocks:
            x = block(x)
        return self.proj_out(x)


RENAMES = {"embed": "proj_in", "layers": "blocks", "head": "proj_out", "norm": "ln", "fc1": "up", "act": "relu",
           "fc2": "down"}
RENAME_RULES = [[r"^embed$", "proj_in"], [r"^head$", "proj_out"], [r"^layers\.(\d+)", r"blocks.\1"],
                [r"\.norm$", ".ln"], [r"\.fc1$", ".up"], [r"\.act$", ".relu"], [r"\.fc2$", ".down"]]


def ref_model(seed: int = 0) -> RefModel:
    torch.manual_seed(seed)
    return RefModel().eval()


def port_model(seed: int = 0) -> PortModel:
    torch.manual_seed(seed)
    return PortModel().eval()


def renamed_port(seed: int = 0) -> RenamedPort:
    """A RenamedPort holding exactly the weights of ``ref_model(seed)``."""
    ref = ref_model(seed)
    port = RenamedPort().eval()
    state = {".".join(RENAMES.get(part, part) for part in key.split(".")): value
             for key, value in ref.state_dict().items()}
    port.load_state_dict(state)
    return port


class NaNReLU(nn.ReLU):
    """A ReLU that writes NaN into its first output element."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x).clone()
        out.view(-1)[0] = float("nan")
        return out


class WithExtra(RefModel):
    """RefModel with one more module, ``extra``, applied before the head."""

    def __init__(self) -> None:
        super().__init__()
        self.extra = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.extra(x))


class CountingLinear(nn.Linear):
    """A Linear that adds ``shift`` to its output on call number ``bug_on_call`` (0-based), if set."""

    def __init__(self, bug_on_call: int | None = None, shift: float = 0.5) -> None:
        super().__init__(4, 4)
        self.bug_on_call, self.shift, self.calls = bug_on_call, shift, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.calls == self.bug_on_call:
            out = out + self.shift
        self.calls += 1
        return out


class SharedThrice(nn.Module):
    """One ``shared`` Linear applied three times in a loop, then ``head``."""

    def __init__(self, bug_on_call: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.shared = CountingLinear(bug_on_call)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.tanh(self.shared(x))
        return self.head(x)


class Recursive(nn.Module):
    """Applies ``step`` and then calls itself ``depth`` more times: one path, nested calls."""

    def __init__(self) -> None:
        super().__init__()
        self.step = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, depth: int = 2) -> torch.Tensor:
        x = torch.tanh(self.step(x))
        return x if depth == 0 else self(x, depth - 1)


class Nested(nn.Module):
    """``inner`` is a ``Recursive`` (``Nested.inner`` is called three times, each call inside the previous)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = Recursive()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class Options(nn.Module):
    """Passes non-tensor options down: ``use_cache`` at the top, ``mode`` to ``inner``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inner = Inner()

    def forward(self, x: torch.Tensor, use_cache: bool = False, mode: str = "sum") -> torch.Tensor:
        return self.inner(x, mode=mode)


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mode: str = "sum") -> torch.Tensor:
        return self.proj(x)  # mode is recorded, not used: the tensors stay identical


class Pair(nn.Module):
    """Returns ``(y, 2y)``, plus ``3y`` when ``extra``."""

    def __init__(self, extra: bool) -> None:
        super().__init__()
        self.extra = extra
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.proj(x)
        return (y, 2 * y, 3 * y) if self.extra else (y, 2 * y)


class CallStyles(nn.Module):
    """Calls ``pair.proj`` with its input by position, or by keyword (``input=``) when ``keyword``."""

    def __init__(self, *, keyword: bool = False, extra: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.keyword = keyword
        self.pair = Pair(extra)
        self.scale = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = self.pair(x)[:2]
        y = self.scale(input=first) if self.keyword else self.scale(first)
        return y + second


# --- capture ------------------------------------------------------------------------------------------------


def call(model: nn.Module, inputs: Any, **kwargs: Any) -> Any:
    with torch.no_grad():
        if isinstance(inputs, dict):
            return model(**inputs, **kwargs)
        return model(inputs, **kwargs)


def capture(model: nn.Module, inputs: Any, out_dir: Path, *, tool: str = "tracediff", call_kwargs: Any = None,
            **options: Any) -> Path:
    """Run ``model`` once under ``tool`` ("tracediff" or "transformers") and return the trace folder."""
    call_kwargs = call_kwargs or {}
    if tool == "tracediff":
        with tracediff.capture(model, out_dir, **options):
            call(model, inputs, **call_kwargs)
    elif tool == "transformers":
        import transformers

        options.setdefault("do_prune_layers", False)
        options.setdefault("use_repr", False)
        with transformers.model_addition_debugger_context(model, debug_path=str(out_dir), **options):
            call(model, inputs, **call_kwargs)
        torch.set_printoptions(profile="default")  # the debugger leaves sci_mode on
    else:
        raise ValueError(tool)
    return out_dir


def perturb(model: nn.Module, parameter: str, delta: float) -> nn.Module:
    """Add ``delta`` to the first row of ``parameter`` (a dotted name)."""
    with torch.no_grad():
        model.get_parameter(parameter)[0] += delta
    return model


def _llama_up_bug(layers: int = 2) -> nn.Module:
    return perturb(llama(layers=layers), f"layers.{layers - 1}.mlp.up_proj.weight", 0.05)


def _llama_eps_bug() -> nn.Module:
    model = llama()
    model.layers[1].input_layernorm.variance_epsilon = 0.5
    return model


def _with_nan() -> nn.Module:
    model = ref_model()
    model.layers[1].act = NaNReLU()
    return model


def _wider() -> nn.Module:
    model = ref_model()
    torch.manual_seed(1)
    model.layers[2].fc1 = nn.Linear(8, 12)
    model.layers[2].fc2 = nn.Linear(12, 8)
    return model


def _with_extra() -> nn.Module:
    ref = ref_model()
    model = WithExtra().eval()
    model.load_state_dict(ref.state_dict())
    return model


def _renamed_bug() -> nn.Module:
    return perturb(renamed_port(), "blocks.1.up.bias", 0.1)


def _bf16_llama() -> nn.Module:
    return llama().to(torch.bfloat16)


# name -> (build model, inputs, capture options)
Recipe = tuple[Callable[[], nn.Module], Any, dict[str, Any]]
HF_FULL = {"tool": "transformers", "use_repr": False, "do_prune_layers": False}
HF_REPR = {"tool": "transformers", "use_repr": True, "do_prune_layers": False}
IDS = {"input_ids": INPUT_IDS}
BERT_INPUTS = {"input_ids": INPUT_IDS, "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0]])}

RECIPES: dict[str, Recipe] = {
    # tiny Llama, 2 layers
    "llama": (llama, IDS, {}),
    "llama-up-bug": (_llama_up_bug, IDS, {}),
    "llama-eps-bug": (_llama_eps_bug, IDS, {}),
    "llama-bf16": (_bf16_llama, IDS, {}),
    "llama-summary": (llama, IDS, {"tensors": "summary"}),
    "llama-summary-up-bug": (_llama_up_bug, IDS, {"tensors": "summary"}),
    "llama-repr": (llama, IDS, {"tensors": "repr"}),
    "llama-hf": (llama, IDS, HF_FULL),
    "llama-hf-up-bug": (_llama_up_bug, IDS, HF_FULL),
    "llama-hf-repr": (llama, IDS, HF_REPR),
    "llama-hf-repr-up-bug": (_llama_up_bug, IDS, HF_REPR),
    # tiny Llama, 3 layers, transformers' default pruning (layers.1 dropped from the JSON)
    "llama3": (lambda: llama(layers=3), IDS, {}),
    "llama3-hf-pruned": (lambda: llama(layers=3), IDS, {**HF_FULL, "do_prune_layers": True}),
    "llama3-hf-pruned-bug": (lambda: _llama_up_bug(3), IDS, {**HF_FULL, "do_prune_layers": True}),
    "llama3-hf-repr-pruned": (lambda: llama(layers=3), IDS, {**HF_REPR, "do_prune_layers": True}),
    # GPT-2 and BERT
    "gpt2": (gpt2, IDS, {}),
    "gpt2-hf": (gpt2, IDS, HF_FULL),
    "gpt2-hf-ln-bug": (lambda: perturb(gpt2(), "h.1.ln_2.bias", 0.05), IDS, HF_FULL),
    "bert": (bert, BERT_INPUTS, {}),
    "bert-hf": (bert, BERT_INPUTS, HF_FULL),
    "bert-hf-repr": (bert, BERT_INPUTS, HF_REPR),
    # plain PyTorch
    "ref": (ref_model, toy_input(), {}),
    "ref-hf": (ref_model, toy_input(), HF_FULL),
    "ref-other-input": (ref_model, toy_input() + 1e-3, {}),
    "port": (port_model, toy_input(), {}),
    "port-fc2-bug": (lambda: perturb(port_model(), "layers.1.fc2.weight", 0.05), toy_input(), {}),
    "renamed": (renamed_port, toy_input(), {}),
    "renamed-bug": (_renamed_bug, toy_input(), {}),
    "nan": (_with_nan, toy_input(), {}),
    "wider": (_wider, toy_input(), {}),
    "extra": (_with_extra, toy_input(), {}),
    "shared": (SharedThrice, toy_input(), {}),
    "shared-bug1": (lambda: SharedThrice(bug_on_call=1), toy_input(), {}),
    "shared-bug2": (lambda: SharedThrice(bug_on_call=2), toy_input(), {}),
    "shared-hf": (SharedThrice, toy_input(), HF_FULL),
    "shared-hf-bug1": (lambda: SharedThrice(bug_on_call=1), toy_input(), HF_FULL),
    "shared-hf-bug2": (lambda: SharedThrice(bug_on_call=2), toy_input(), HF_FULL),
    "nested": (Nested, toy_input(), {}),
    "nested-hf": (Nested, toy_input(), HF_FULL),
    "styles": (CallStyles, toy_input(), {}),
    "styles-keyword": (lambda: CallStyles(keyword=True), toy_input(), {}),
    "styles-extra-output": (lambda: CallStyles(extra=True), toy_input(), {}),
    "options-true": (Options, toy_input(), {"call_kwargs": {"use_cache": True, "mode": "sum"}}),
    "options-false": (Options, toy_input(), {"call_kwargs": {"use_cache": False, "mode": "mean"}}),
    "options-hf-true": (Options, toy_input(), {**HF_FULL, "call_kwargs": {"use_cache": True, "mode": "sum"}}),
}


class TraceStore:
    """Captures each recipe once per test session, on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._done: dict[str, Path] = {}

    def __call__(self, name: str) -> Path:
        if name not in self._done:
            build, inputs, options = RECIPES[name]
            options = dict(options)
            self._done[name] = capture(build(), inputs, self.root / name, **options)
        return self._done[name]


_STORE: TraceStore | None = None


def trace_store(factory: Any) -> TraceStore:
    """The session's store (one per test run, shared by every test module)."""
    global _STORE
    if _STORE is None:
        _STORE = TraceStore(factory.mktemp("traces"))
    return _STORE


# --- editing traces -----------------------------------------------------------------------------------------


def copy_trace(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def trace_json_path(folder: Path, kind: str = "FULL_TENSORS") -> Path:
    (path,) = folder.glob(f"*_debug_tree_{kind}.json")
    return path


def edit_json(folder: Path, edit: Callable[[dict[str, Any]], None], kind: str = "FULL_TENSORS") -> Path:
    path = trace_json_path(folder, kind)
    tree = json.loads(path.read_text())
    edit(tree)
    path.write_text(json.dumps(tree, indent=2))
    return path


def json_nodes(tree: dict[str, Any]) -> list[dict[str, Any]]:
    out = [tree]
    for child in tree.get("children", []):
        out.extend(json_nodes(child))
    for later in tree.get("subsequent_calls", []):
        out.extend(json_nodes(later))
    return out


def json_node(tree: dict[str, Any], path: str, call_index: int = 0) -> dict[str, Any]:
    return [n for n in json_nodes(tree) if n["module_path"] == path][call_index]


def run_cli(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    """Run ``tracediff`` in-process; returns (exit code, stdout, stderr). Usage errors exit through SystemExit."""
    from tracediff.cli.main import main

    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 2
    out, err = capsys.readouterr()
    return code, out, err
