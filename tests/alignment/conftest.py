"""The session's trace store: ``traces("llama-hf")`` captures on first use (see ``helpers.RECIPES``)."""

from __future__ import annotations

import pytest

from tests.alignment.helpers import TraceStore, trace_store


@pytest.fixture(scope="session")
def traces(tmp_path_factory: pytest.TempPathFactory) -> TraceStore:
    return trace_store(tmp_path_factory)
