"""llama.cpp at its defaults: transformers (A) against llama.cpp's own GGUF conversion (B), captured as users do.

``tracediff capture model.gguf --inputs ids.safetensors --out DIR`` with no option: flash attention ``auto``
(used on CPU) and the F16 KV cache; and ``--kv-cache-type f32`` with flash attention ``auto``, where ggml
copies the cache views to float16 for its flash attention kernel. Stock transformers families (Llama, Qwen2,
Gemma 2, Gemma 3, Mixtral, Qwen3-MoE; tiny configs, seeded random weights, tests/ports/llama_cpp_harness.py) are
aligned with zero options: a clean conversion passes, its rows within llama.cpp's own rounding accepted within a
bound derived from that rounding (docs/verdicts.md, runtime approximations), and a planted mistake is named
at its module of A.

Why this holds on any x86-64 CPU: the bounds are upper bounds of the IEEE float16 rounding ggml does
(round to nearest, unit roundoff 2**-11, F16C or ggml's software conversion alike) and of float32 sums in
any order (AVX2, AVX-512 and AMX reorder them; Higham's gamma_n covers every order): a clean run can never
exceed them. The planted mistakes change values by far more than a float16 rounding (swapped matrices, a
rotary on the wrong pairs, a norm weight off by one, another matrix): their errors are O(1) relative, the
bounds about 1% of the attended values' magnitude.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.ports.llama_cpp_fixtures import require_llama_cpp
from tests.ports.test_llama_cpp import INSTALL

require_llama_cpp(INSTALL)
pytest.importorskip("gguf", reason=f"gguf is not installed (the llama extra): {INSTALL}")
pytest.importorskip("sentencepiece", reason=f"sentencepiece is not installed (the llama extra): {INSTALL}")

from tests.ports.harness import CLEAN  # noqa: E402
from tests.ports.llama_cpp_harness import (  # noqa: E402
    FAMILIES,
    Family,
    GgufBug,
    GgufRun,
    _cli,
    bias_lost,
    gate_up_swapped,
    output_tied,
    tensor,
    unpermute,
)

# the configurations users run: llama.cpp as it ships, an F32 cache (flash attention still auto); then the
# documented switch that checks a conversion alone, every node in float32
CONFIGURATIONS: dict[str, tuple[str, ...]] = {"defaults": (), "f32-cache": ("--kv-cache-type", "f32"),
                                              "flash-attn-off": ("--kv-cache-type", "f32", "--flash-attn", "off")}


def qk_not_permuted_in(layer: int) -> GgufBug:
    """One layer's q/k rows left in transformers' order: llama.cpp's NORM rope rotates the wrong pairs there."""
    def edit(reader: Any, config: dict[str, Any]) -> None:
        q, k = tensor(reader, f"blk.{layer}.attn_q.weight"), tensor(reader, f"blk.{layer}.attn_k.weight")
        q[...] = unpermute(np.array(q), config["num_attention_heads"])
        k[...] = unpermute(np.array(k), config["num_key_value_heads"])

    return GgufBug(f"qk-not-permuted-{layer}", f"layer {layer}'s q/k rows not permuted for the rotary",
                   f"model.layers.{layer}.self_attn", edit)


def first_two_swapped(name: str, weight: str, what: str, module: str) -> GgufBug:
    """The first two items (rows, or stacked experts) of ``weight`` written in each other's place."""
    def edit(reader: Any, config: dict[str, Any]) -> None:
        data = tensor(reader, weight)
        saved = np.array(data[0])
        data[0] = data[1]
        data[1] = saved

    return GgufBug(name, f"{weight} with {what} 0 and 1 swapped", module, edit)


def experts_swapped(layer: int) -> GgufBug:
    """Two experts of a stacked gate projection written in each other's place."""
    return first_two_swapped("experts-swapped", f"blk.{layer}.ffn_gate_exps.weight", "experts",
                             f"model.layers.{layer}.mlp")


def router_rows_swapped(layer: int) -> GgufBug:
    """Two rows of a router (``ffn_gate_inp``) written in each other's place: tokens go to the wrong experts."""
    return first_two_swapped("router-rows-swapped", f"blk.{layer}.ffn_gate_inp.weight", "rows",
                             f"model.layers.{layer}.mlp.gate")


def gemma_norm_no_shift() -> GgufBug:
    return FAMILIES["gemma2"].bug("norm-no-shift")


def clean_passes(family: Family, *bugs: GgufBug) -> Family:
    """``family`` with ``bugs`` only and no known clean divergence: at the defaults a clean conversion passes."""
    return dataclasses.replace(family, bugs=bugs, clean_module=None)


QWEN3_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True}

MATRIX: tuple[Family, ...] = (
    clean_passes(FAMILIES["llama"], qk_not_permuted_in(1), gate_up_swapped(), output_tied()),
    clean_passes(FAMILIES["qwen2"], bias_lost("k")),
    clean_passes(FAMILIES["gemma2"], gemma_norm_no_shift()),
    clean_passes(FAMILIES["gemma3"], FAMILIES["gemma3"].bug("k-norm-scaled")),
    Family("mixtral", "MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2},
           (router_rows_swapped(0), experts_swapped(0))),
    # the released Qwen3-MoE models renormalise the top-k routing weights (norm_topk_prob), as llama.cpp does
    Family("qwen3-moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", QWEN3_MOE,
           (router_rows_swapped(0), experts_swapped(0))),
    # found in the wild: llama.cpp's qwen3moe graph renormalises the top-k weights whatever the checkpoint says;
    # transformers' own default (norm_topk_prob false) converts without a word and differs at the experts' sum
    Family("qwen3-moe-unnormalised", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", {**QWEN3_MOE, "norm_topk_prob": False},
           (), clean_module="model.layers.0.mlp"),
)

@dataclass
class DefaultsRun(GgufRun):
    """A family's traces captured with ``options`` (the defaults: none), beside the harness's reference."""

    options: tuple[str, ...] = ()

    def trace(self, case: str) -> Path:
        if case == "reference" or case in self._traces:
            return super().trace(case)
        out = self.folder / f"trace-{case}-{'-'.join(self.options) or 'defaults'}"
        if not out.exists():
            code, text = _cli(["capture", str(self.gguf(case)), "--inputs", str(self.inputs()), "--out", str(out),
                               *self.options])
            if code != 0:
                raise RuntimeError(f"capture of {case} exited {code}: {text}")
        self._traces[case] = out
        return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], DefaultsRun]:
    root = tmp_path_factory.mktemp("llama-cpp-defaults")
    return {(family.name, name): DefaultsRun(family, root, options=options)
            for family in MATRIX for name, options in CONFIGURATIONS.items()}


@pytest.mark.slow
@pytest.mark.parametrize(("family", "case", "configuration"), [
    pytest.param(family.name, case, name, id=f"{family.name}-{case}-{name}")
    for family in MATRIX for case in (CLEAN, *(bug.name for bug in family.bugs)) for name in CONFIGURATIONS])
def test_verdict_at_defaults(runs: dict[tuple[str, str], DefaultsRun], family: str, case: str,
                             configuration: str) -> None:
    outcome = runs[family, configuration].judge(case)
    assert outcome.right, outcome


def test_flash_attention_is_used_at_the_defaults(runs: dict[tuple[str, str], DefaultsRun]) -> None:
    """What the matrix tests: ggml's flash attention with float16 K and V, at both configurations."""
    import json

    for name in ("defaults", "f32-cache"):
        trace = runs["llama", name].trace(CLEAN)
        runtime = json.loads((trace / "tracediff_metadata.json").read_text())["runtime"]
        assert runtime["flash_attn"] == "auto" and runtime["flash_attn_used"] is True, runtime
        assert runtime["weight_types"].get("cache_k_l0 (view) (permuted) (copy)", runtime["kv_cache_type"]["k"]) \
            == "f16", runtime
