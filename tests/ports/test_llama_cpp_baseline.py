"""Lossy llama.cpp runs (F16, BF16 and Q8_0 GGUFs, the default F16 KV cache) judged with ``--baseline``.

A is the float32 transformers Llama, B llama.cpp on a lossy run of its conversion, N the reference under B's
rounding (tests/ports/llama_cpp_baseline.py). Without N a clean lossy run diverges; with N it passes, and a
mistake planted in the lossy GGUF is still named at its module of A.

Why the verdicts hold on any x86-64 CPU: ggml's CPU matmul with F16 (BF16) weights rounds its activations to
float16 (bfloat16) too (the type's ``vec_dot_type``), so B's error at a projection is the weight rounding N makes
plus one more rounding of the same size (2**-11, 2**-8 relative per term): at most about twice N's floor,
within the noise factor 3. The F16
KV cache rounds K, V, Q and the attention weights once each to float16; N in float16 rounds those and every
other tensor, so its floor is at least the cache's error. The planted mistakes change values by far more than
a float16 rounding (swapped matrices, a tenfold eps, another matrix).
"""

from __future__ import annotations

import pytest
import torch

from tests.ports.llama_cpp_fixtures import require_llama_cpp
from tests.ports.test_llama_cpp import INSTALL

require_llama_cpp(INSTALL)
pytest.importorskip("gguf", reason=f"gguf is not installed (the llama extra): {INSTALL}")
pytest.importorskip("sentencepiece", reason=f"sentencepiece is not installed (the llama extra): {INSTALL}")

from tests.ports.harness import inside  # noqa: E402
from tests.ports.llama_cpp_baseline import LossyRun  # noqa: E402
from tests.ports.llama_cpp_harness import FAMILIES, GgufRun  # noqa: E402

LLAMA = FAMILIES["llama"]
HALF = ("f16", "bf16")  # the converter's --outtype; gguf-py's type is its upper case
PLANTED = ("gate-up-swapped", "norm-eps", "output-tied", "v-permuted")


@pytest.fixture(scope="module")
def lossy(tmp_path_factory: pytest.TempPathFactory) -> LossyRun:
    return LossyRun(GgufRun(LLAMA, tmp_path_factory.mktemp("llama-cpp-lossy")))


@pytest.mark.parametrize("outtype", HALF)
def test_half_gguf_diverges_without_baseline(lossy: LossyRun, outtype: str) -> None:
    judged = lossy.align(lossy.llama_cpp(lossy.gguf(outtype)))
    assert judged.exit_code == 1 and judged.module is not None, judged


@pytest.mark.parametrize("outtype", HALF)
@pytest.mark.parametrize("baseline", ["rounded-reference", "transformers-gguf"])
def test_half_gguf_passes_with_baseline(lossy: LossyRun, outtype: str, baseline: str) -> None:
    gguf = lossy.gguf(outtype)
    n = lossy.reference_rounded(outtype.upper()) if baseline == "rounded-reference" else lossy.reference_from_gguf(gguf)
    judged = lossy.align(lossy.llama_cpp(gguf), n)
    assert judged.exit_code == 0, judged


@pytest.mark.parametrize("outtype", HALF)
@pytest.mark.parametrize("case", PLANTED)
def test_half_gguf_mistake_named_with_baseline(lossy: LossyRun, outtype: str, case: str) -> None:
    judged = lossy.align(lossy.llama_cpp(lossy.gguf(outtype, case)), lossy.reference_rounded(outtype.upper()))
    assert judged.exit_code == 1 and inside(judged.module, LLAMA.bug(case).module), judged


def test_baseline_loaded_from_the_gguf_under_test_carries_its_mistake(lossy: LossyRun) -> None:
    """transformers reads ``output.weight`` as written: N holds the same mistake as B and hides it."""
    gguf = lossy.gguf("f16", "output-tied")
    judged = lossy.align(lossy.llama_cpp(gguf), lossy.reference_from_gguf(gguf))
    assert judged.exit_code == 0, judged


def test_a_permuted_v_is_not_hidden_by_a_baseline_that_carries_it(lossy: LossyRun) -> None:
    """N reads ``attn_v`` as written too, but B's ``Vcur`` then agrees with no call of A at ``v_proj``'s place:
    the call is listed as unplaced and the verdict is undecided, never a pass the baseline bought."""
    gguf = lossy.gguf("f16", "v-permuted")
    judged = lossy.align(lossy.llama_cpp(gguf), lossy.reference_from_gguf(gguf))
    assert judged.exit_code == 1 and "v_proj" in judged.text and "unplaced" in judged.text, judged


def test_q8_0_gguf_diverges_without_baseline(lossy: LossyRun) -> None:
    judged = lossy.align(lossy.llama_cpp(lossy.gguf("q8_0")))
    assert judged.exit_code == 1 and judged.module is not None, judged


def test_q8_0_gguf_passes_with_baseline(lossy: LossyRun) -> None:
    judged = lossy.align(lossy.llama_cpp(lossy.gguf("q8_0")), lossy.reference_rounded("Q8_0"))
    assert judged.exit_code == 0, judged


# Not "norm-eps" here: eps 1e-5 for 1e-6 on activations of mean square ~4e-4 moves the norm's output by ~1.1%,
# while half a Q8_0 step is ~0.39% of a block's maximum, so the mistake is under 3x (the noise factor) what Q8_0
# itself makes: below what a Q8_0 run can resolve, on any CPU.
@pytest.mark.parametrize("case", ["gate-up-swapped"])
def test_q8_0_gguf_mistake_named_with_baseline(lossy: LossyRun, case: str) -> None:
    judged = lossy.align(lossy.llama_cpp(lossy.gguf("q8_0", case)), lossy.reference_rounded("Q8_0"))
    assert judged.exit_code == 1 and inside(judged.module, LLAMA.bug(case).module), judged


def test_f16_kv_cache_diverges_without_baseline(lossy: LossyRun) -> None:
    judged = lossy.align(lossy.llama_cpp(lossy.gguf("f32"), kv_cache="f16"))
    assert judged.exit_code == 1 and inside(judged.module, "model.layers.0.self_attn"), judged


def test_f16_kv_cache_passes_with_float16_reference(lossy: LossyRun) -> None:
    judged = lossy.align(lossy.llama_cpp(lossy.gguf("f32"), kv_cache="f16"), lossy.reference_in(torch.float16))
    assert judged.exit_code == 0, judged


@pytest.mark.parametrize("case", ["gate-up-swapped", "norm-eps"])
def test_f16_kv_cache_mistake_named_with_float16_reference(lossy: LossyRun, case: str) -> None:
    judged = lossy.align(lossy.llama_cpp(lossy.gguf("f32", case), kv_cache="f16"), lossy.reference_in(torch.float16))
    assert judged.exit_code == 1 and inside(judged.module, LLAMA.bug(case).module), judged
