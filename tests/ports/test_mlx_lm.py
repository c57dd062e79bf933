"""transformers (A) against mlx-lm's own implementations (B) of six families, with zero options.

Llama, Qwen3, Phi-3 (fused ``qkv_proj`` and ``gate_up_proj``), Gemma 2, Mixtral and Qwen2-MoE (stacked experts,
mlx-lm's own MoE block names): the clean conversions pass at the default tolerances, the bf16 ports pass
with ``--baseline``, and each planted mistake is named at its module (tests/ports/mlx_harness.py).
"""

from __future__ import annotations

import pytest

from tests.ports.mlx_harness import INSTALL

pytest.importorskip("mlx.core", reason=f"mlx is not installed (the mlx extra): {INSTALL}")
pytest.importorskip("mlx_lm", reason=f"mlx-lm is not installed (the mlx extra): {INSTALL}")

from tests.ports.mlx_harness import PORTS, MlxPortRun  # noqa: E402

# (port, case) tracediff gets wrong today, with what goes wrong: none
WRONG: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MlxPortRun]:
    root = tmp_path_factory.mktemp("mlx-ports")
    return {port.name: MlxPortRun(port, root) for port in PORTS}


@pytest.mark.parametrize(("port", "case"), [
    pytest.param(port.name, case, id=f"{port.name}-{case}",
                 marks=[pytest.mark.xfail(strict=True, reason=WRONG[port.name, case])]
                 if (port.name, case) in WRONG else [])
    for port in PORTS for case in port.cases()])
def test_verdict(runs: dict[str, MlxPortRun], port: str, case: str) -> None:
    outcome = runs[port].judge(case)
    assert outcome.right, outcome
