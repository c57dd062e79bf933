"""transformers (A) against llama.cpp running llama.cpp's own GGUF conversion (B), with zero options.

Llama, Qwen2, Gemma 2, Gemma 3, StableLM and SmolLM3, converted by ``convert_hf_to_gguf.py`` to F32 GGUFs and
run with an F32 KV cache and flash attention off: the clean conversions pass (ggml's GELU table read as the runtime's
rounding), each mistake planted in the GGUF (tests/ports/llama_cpp_harness.py) is named at its module of A, and a
checkpoint whose layer pattern the GGUF cannot hold (SmolLM3 without rotary in layer 1, Gemma 3 with a global
layer 1) at layer 1's attention.
"""

from __future__ import annotations

import pytest

from tests.ports.llama_cpp_fixtures import require_llama_cpp

INSTALL = ('CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF" pip install -c constraints.txt -e ".[llama]" '
           "(builds llama.cpp: a C++ compiler and cmake)")
require_llama_cpp(INSTALL)
pytest.importorskip("gguf", reason=f"gguf is not installed (the llama extra): {INSTALL}")
pytest.importorskip("sentencepiece", reason=f"sentencepiece is not installed (the llama extra): {INSTALL}")

from tests.ports.llama_cpp_harness import FAMILIES, GgufRun  # noqa: E402

# (family, case) tracediff gets wrong today, with what goes wrong
WRONG: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, GgufRun]:
    root = tmp_path_factory.mktemp("llama-cpp")
    return {name: GgufRun(family, root) for name, family in FAMILIES.items()}


@pytest.mark.parametrize(("family", "case"), [
    pytest.param(family.name, case, id=f"{family.name}-{case}",
                 marks=[pytest.mark.xfail(strict=True, reason=WRONG[family.name, case])]
                 if (family.name, case) in WRONG else [])
    for family in FAMILIES.values() for case in family.cases()])
def test_verdict(runs: dict[str, GgufRun], family: str, case: str) -> None:
    outcome = runs[family].judge(case)
    assert outcome.right, outcome
