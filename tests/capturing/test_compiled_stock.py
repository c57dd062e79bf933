"""Stock transformers models under ``torch.compile`` at its defaults: the capture holds every call.

What a user runs: ``torch.compile(model)`` (inductor, default mode, ``dynamic=None``), transformers' default
attention (sdpa) and cache (on), ``model(input_ids=ids)``. The compiled capture must have eager's call tree
(paths, calls, the tensors of every call) and pass against it at the default tolerances; a compile-only
mistake must be named at its module. Tiny configs (hidden 64, 2 layers): each inductor compile costs
seconds on 2 cores, so one variant per family, ``dynamic=True`` and a compiled ``forward`` on one each.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import tracediff

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

VOCAB = 128
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64)
# Each family at transformers' defaults but for its size; Gemma 3 with its sliding and global layers both.
FAMILIES: dict[str, Callable[[], nn.Module]] = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**_COMMON)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**_COMMON, head_dim=16)),
    "gemma2": lambda: transformers.Gemma2ForCausalLM(
        transformers.Gemma2Config(**_COMMON, head_dim=16, sliding_window=4)),
    "gemma3": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **_COMMON, head_dim=16, sliding_window=4, layer_types=["sliding_attention", "full_attention"])),
    "qwen3-moe": lambda: transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        **_COMMON, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
}


def stock(family: str) -> nn.Module:
    torch.manual_seed(0)
    return FAMILIES[family]().eval()


def token_ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled(model: nn.Module, how: str) -> nn.Module:
    if how == "forward":  # as transformers' compiled decoding does
        model.forward = torch.compile(model.forward)  # type: ignore[method-assign]
        return model
    return torch.compile(model, dynamic=True) if how == "dynamic=True" else torch.compile(model)  # type: ignore[return-value]


def capture(model: nn.Module, out: Path, ids: torch.Tensor) -> Any:
    with torch.no_grad(), tracediff.capture(model, out) as session:
        model(input_ids=ids)
    return session


def tree(folder: Path) -> list[tuple[Any, ...]]:
    """Every call in order: where it is, and what it holds (each tensor's slot, shape, dtype; other values' slots)."""
    return [(node.module_path, node.call_index, node.module_type, node.depth, node.has_outputs,
             [(t.slot, t.shape, t.dtype) for t in node.tensors], sorted(node.values))
            for root in tracediff.load_trace(folder).roots for node in root.walk()]


def metadata(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "tracediff_metadata.json").read_text())


@pytest.mark.parametrize(("family", "how"), [
    *[(family, "torch.compile(model)") for family in FAMILIES],
    ("llama", "dynamic=True"),
    ("qwen3", "forward"),
])
def test_a_stock_model_compiled_at_the_defaults_is_captured_call_for_call(tmp_path: Path, family: str,
                                                                          how: str) -> None:
    model, ids = stock(family), token_ids()
    eager = capture(model, tmp_path / "eager", ids)
    session = capture(compiled(model, how), tmp_path / "compiled", ids)

    assert session.complete and session.calls == eager.calls
    found = metadata(tmp_path / "compiled")
    assert found["unrecorded_calls"] is None and found["compile"]["during_capture"]["frames_compiled"] >= 1
    assert tree(tmp_path / "compiled") == tree(tmp_path / "eager")
    # float32 throughout: inductor's kernels differ from eager's by rounding only, within the defaults
    result = tracediff.align(tmp_path / "eager", tmp_path / "compiled")
    assert result.verdict == "passed" and len(result.rows) > 0
    assert not result.unmatched_a and not result.unmatched_b


def plant_compile_only_branch(module: nn.Module) -> None:
    """``module`` computes 1.5 times its output when compiled (class name kept: the trees still match)."""
    base = type(module)

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        out = base.forward(self, *args, **kwargs)
        return out * 1.5 if torch.compiler.is_compiling() else out

    module.__class__ = type(base.__name__, (base,), {"forward": forward})


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_compile_only_mistake_in_one_layer_is_named_at_its_module(tmp_path: Path, family: str) -> None:
    model, ids = stock(family), token_ids()
    plant_compile_only_branch(model.model.layers[1].mlp)
    capture(model, tmp_path / "eager", ids)
    session = capture(torch.compile(model), tmp_path / "compiled", ids)
    assert session.complete
    result = tracediff.align(tmp_path / "eager", tmp_path / "compiled")
    assert result.first_divergence is not None
    assert result.first_divergence.module_path_b == f"{type(model).__name__}.model.layers.1.mlp"



def test_verify_compares_the_logits_and_not_the_cache_the_graph_did_not_keep(tmp_path: Path) -> None:
    model, ids = stock("llama"), token_ids()
    compiled_model = torch.compile(model)
    with torch.no_grad(), tracediff.capture(compiled_model, tmp_path / "compiled", verify=True) as session:
        compiled_model(input_ids=ids)
    # The cache is recorded by its type name inside the graph: nothing to compare it with. The logits are
    # compared; whether their bits match depends on how inductor fused the uncaptured graph (docs/compiled.md).
    assert session.verification is not None and session.verification.compared == 1
    assert all(d.startswith("outputs.logits: values differ") for d in session.verification.differences)
