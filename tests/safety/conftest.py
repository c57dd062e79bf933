from __future__ import annotations

from pathlib import Path

import pytest

from tests.safety.helpers import capture_small


@pytest.fixture(scope="session")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete trace of ``Small`` (read-only: copy it before editing)."""
    return capture_small(tmp_path_factory.mktemp("safety") / "small")
