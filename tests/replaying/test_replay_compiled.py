"""``tracediff.replay`` of a B that runs under ``torch.compile``: each module is replayed compiled.

A's trace is the eager model's; B is the same model (same seed, same weights) compiled. A mistake that only
compiled code makes (a ``torch.compiler.is_compiling()`` branch) is named at its module; a clean compile
passes. Inductor compiles each replayed module on CPU (two blocks of width 16, ``dynamic=False``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import tracediff
from tests.capturing.test_compiled import CompilingBranch, tiny, tokens


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def eager_trace(folder: Path) -> Path:
    model, x = tiny(CompilingBranch()), tokens()
    with torch.no_grad(), tracediff.capture(model, folder):
        model(x)
    return folder


def test_a_compile_only_mistake_is_named_at_its_module(tmp_path: Path) -> None:
    trace_a = eager_trace(tmp_path / "eager")
    # B is A's model compiled: eager, CompilingBranch multiplies by 2; compiled, by 2.5.
    result = tracediff.replay(torch.compile(tiny(CompilingBranch()), dynamic=False), trace_a)
    assert result.compiled and result.verdict == "diverged"
    assert not result.oracle and any("without the float64 oracle" in w for w in result.warnings)
    assert [call.module_path_b for call in result.culprits] == ["Tiny.extra"]
    # B's own paths: no ``_orig_mod``, every call of A paired
    assert all("_orig_mod" not in call.module_path_b for call in result.modules)
    assert len(result.modules) == 12 and not result.skipped
    # Only the mistake and the root around it differ: each block after it runs on A's recorded inputs. The
    # root is explained by the mistake (rerun compiled with A's output of ``extra`` in its place).
    differing = {call.module_path_b for call in result.modules if call.verdict == "out of tolerance"}
    assert differing == {"Tiny", "Tiny.extra"}
    root = next(call for call in result.modules if call.module_path_b == "Tiny")
    assert root.explained_by == ("Tiny.extra",)
    # B's end-to-end error is its compiled model's: extra's 25% error, through layers.1's LayerNorm
    assert result.end_to_end is not None and result.end_to_end["max_abs_err"] > 1e-3


def test_a_clean_compile_passes(tmp_path: Path) -> None:
    folder = tmp_path / "eager"
    model, x = tiny(), tokens()
    with torch.no_grad(), tracediff.capture(model, folder):
        model(x)
    result = tracediff.replay(torch.compile(tiny(), dynamic=False), folder)
    # Inductor's float32 kernels differ from eager's by float32 rounding only (a few ulps per output, from
    # sums of 16 or 64 terms in another order: at most n*eps32 relative), inside torch.testing's float32
    # tolerance (rtol 1.3e-6 ~ 11 eps32, atol 1e-5 for values near 0).
    assert result.compiled and result.passed, result.culprits
    assert result.compared == len(result.modules) and not result.skipped


def test_a_compiled_layer_is_replayed_under_its_own_path(tmp_path: Path) -> None:
    trace_a = eager_trace(tmp_path / "eager")
    model = tiny(CompilingBranch())
    model.extra = torch.compile(model.extra, dynamic=False)  # regional: the wrapper replaces the layer
    result = tracediff.replay(model, trace_a)
    assert result.compiled
    assert [call.module_path_b for call in result.culprits] == ["Tiny.extra"]
    assert all("_orig_mod" not in call.module_path_b for call in result.modules) and not result.skipped


def test_what_differs_for_a_compiled_b_is_decided_once() -> None:
    """``how_b_runs``: an eager B as it is; a compiled one by its own modules, each replayed through its own
    ``torch.compile`` (made once), and no float64 oracle."""
    from tracediff.replaying.compiled import CompiledB, EagerB, how_b_runs

    model = tiny()
    eager_b = how_b_runs(model)
    assert type(eager_b) is EagerB and eager_b.model is model and eager_b.oracle_allowed and not eager_b.compiled
    assert eager_b.runnable(model.extra) is model.extra and eager_b.whole() is model
    compiled = torch.compile(model, dynamic=False)
    compiled_b = how_b_runs(compiled)
    assert isinstance(compiled_b, CompiledB) and compiled_b.model is model and compiled_b.whole() is compiled
    assert not compiled_b.oracle_allowed and compiled_b.compiled
    assert not any("_orig_mod" in path for path in compiled_b.module_table())
    run = compiled_b.runnable(model.extra)
    assert run is not model.extra and compiled_b.runnable(model.extra) is run
