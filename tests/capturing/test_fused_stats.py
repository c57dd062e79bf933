"""The fused statistics kernel (``tracediff.capturing.fused_stats``) against the host implementation.

Without a GPU, the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``) on CPU tensors: the
same program, element for element, so its maths is what is checked here. Triton comes with PyTorch's CUDA
builds; on this CPU build it is installed by the ``ports`` extra (openai-whisper needs it). Without it the
test is skipped: the capture then never uses the kernel either.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tracediff.capturing import fused_stats
from tracediff.capturing.stats import StatsBuffers, float_summary, tensor_stats, wide_partials

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed (PyTorch's CUDA builds ship it; here: the ports extra)",
                allow_module_level=True)

inf, nan = math.inf, math.nan
ROOT = Path(__file__).resolve().parents[2]


def _values(seed: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 3 + 0.5).to(dtype)


CASES: dict[str, Any] = {
    "float32, several blocks, a partial last one": lambda: _values(0, 3 * fused_stats.BLOCK + 17, torch.float32),
    "bfloat16": lambda: _values(1, 1500, torch.bfloat16),
    "float16": lambda: _values(2, 700, torch.float16),
    "float64": lambda: _values(3, 2100, torch.float64),
    "nan, infinities, zeros": lambda: torch.tensor([1.0, nan, inf, -inf, 0.0, -0.0, -3.0, nan, 2.5]),
    "only non-finite": lambda: torch.tensor([nan, inf, -inf]),
}

# Run in a process of its own: Triton decides at import whether it interprets, and this process may have
# imported it already (openai-whisper does).
_CHILD = """
import json, sys, warnings
warnings.simplefilter("ignore")  # inf - inf, on purpose
from tests.capturing.test_fused_stats import CASES
from tracediff.capturing import device_stats, fused_stats
from tracediff.capturing.device_stats import DeviceStats
from tracediff.capturing.stats import StatsBuffers
device_stats._DEVICES_READ_DIRECTLY = {"meta"}  # the device path, on CPU tensors
launched = []
fused = device_stats.fused_partials
device_stats.fused_partials = lambda t: launched.append(1) or fused(t)
out = {}
for name, make in CASES.items():
    x = make()
    pending = DeviceStats(StatsBuffers())
    stats = {}
    pending.launch(x, {"shape": "s", "stats": stats}, stats)
    pending.resolve()
    out[name] = {"available": fused_stats.fused_available(x), "partials": fused(x).tolist(), "stats": stats,
                 "kernels": len(launched)}
    launched.clear()
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def interpreted() -> dict[str, Any]:
    """Per case: what the kernel found under Triton's interpreter, in a child process."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found: dict[str, Any] = json.loads(done.stdout)
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_partials_agree_with_wide_partials(case: str, interpreted: dict[str, Any]) -> None:
    x = CASES[case]()
    assert interpreted[case]["available"]
    fused = interpreted[case]["partials"]
    wide = wide_partials(x.reshape(-1), StatsBuffers()).tolist()
    assert fused[0] == wide[0] and fused[1] == wide[1]  # finite min and max: exact
    assert fused[5:] == wide[5:]  # non-zeros, finite, NaN and +inf counts: exact
    # The sums: float32 within a block of 1,024 elements (a tree of 10 additions, each rounding by 2**-24 at
    # most) against float64 per element; float64 tensors are summed in float64 throughout.
    rel = 1e-12 if x.dtype == torch.float64 else 10 * 2.0 ** -24
    for got, want, scale in zip(fused[2:5], wide[2:5], (wide[4], wide[3], wide[4])):  # |x| sum bounds sum
        assert abs(got - want) <= rel * scale


@pytest.mark.parametrize("case", sorted(CASES))
def test_recorded_statistics_from_the_fused_kernel_match_the_host(case: str, interpreted: dict[str, Any]) -> None:
    """Through ``DeviceStats`` (forced onto CPU tensors), as a capture on a GPU records them."""
    x = CASES[case]()
    found = interpreted[case]
    assert found["kernels"] == 1  # one kernel for the whole tensor
    stats, host = found["stats"], tensor_stats(x)
    assert list(stats) == list(host)
    for key, want in host.items():
        got = stats[key]
        if isinstance(want, float) and math.isnan(want):
            assert math.isnan(got), key
        elif key in ("numel", "min", "max", "nan", "posinf", "neginf", "zeros"):
            assert got == want, key
        else:  # host: float32 sums over chunks of 2**20; here blocks of 1,024: both round in the 7th digit
            assert got == pytest.approx(want, rel=1e-6, abs=1e-9), key
    assert json.dumps(float_summary(x.numel(), [found["partials"]])) == json.dumps(stats)  # (NaN as text)


def test_without_the_interpreter_a_cpu_tensor_is_not_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not fused_stats.fused_available(torch.ones(4))
