"""Shared fixtures: torch print options reset around every test, and the tiny models of ``tests/models.py``.

Hypothesis runs under the ``ci`` profile unless ``HYPOTHESIS_PROFILE`` names
another: derandomized (the same examples on every run and every machine), no
example database, and the reproduction blob printed on failure. Keep every
shrunk failure as an ``@example``. ``HYPOTHESIS_PROFILE=explore`` draws new
random examples, for hunting bugs locally.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from tests import models

settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None)
settings.register_profile("explore", derandomize=False, database=None, print_blob=True, deadline=None,
                          max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_report_header() -> str:
    """The machine the tests run on (CPU model, torch's CPU capability, cores), in the run's header."""
    spec = importlib.util.spec_from_file_location(
        "machine_line", Path(__file__).resolve().parents[1] / "scripts" / "machine_line.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.machine_line())


@pytest.fixture(autouse=True, scope="session")
def _compiled_pass_built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The C build of the comparison's pass, built once into a cache of this run's own before any test: every
    test (and every process a test starts) then meets the state a user has after the first large ``align``,
    whatever ran before, and no test writes to the user's cache."""
    from tracediff.native import fused_c

    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    fused_c.load()  # None without a C compiler: then numba's build or numpy, as for a user
    yield
    if before is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture(autouse=True, scope="session")
def _written_traces_conform_to_the_schema() -> Iterator[None]:
    """Every trace any test writes is validated against ``tracediff/trace_schema.json`` as it is written."""
    try:
        from tests.format.conformance import written_traces_conform
    except ImportError:  # jsonschema missing (it is in the ``test`` extra): nothing to validate with
        yield
        return
    with written_traces_conform():
        yield


@pytest.fixture(autouse=True)
def _default_print_options() -> Iterator[None]:
    """transformers' debugger turns ``sci_mode`` on globally and never restores it; start and end at defaults."""
    torch.set_printoptions(profile="default")
    yield
    torch.set_printoptions(profile="default")


@pytest.fixture
def tiny_llama() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    return models.tiny_llama()


@pytest.fixture
def tiny_gpt2() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    return models.tiny_gpt2()


@pytest.fixture
def tiny_bert() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    return models.tiny_bert()
