"""A demo alignment shared by the report tests (one capture of the demo models per session)."""

from __future__ import annotations

import pytest

from tracediff.alignment.result import Alignment
from tracediff.demo import DemoResult, run_demo


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    return run_demo(tmp_path_factory.mktemp("render") / "demo")


@pytest.fixture(scope="session")
def demo_alignment(demo_run: DemoResult) -> Alignment:
    return demo_run.alignment
