"""Reading and aligning pause the cyclic garbage collector, and always give it back as they found it."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from tracediff.cli.process import paused_gc
from tracediff.errors import TraceFormatError
from tracediff.show import show_trace
from tracediff.trace.load import load_trace

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "llama_tiny" / "repr"


def test_paused_inside_restored_after_also_on_error_and_when_nested() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block does not re-enable what the outer one paused
        raise RuntimeError
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


def test_reading_showing_and_failing_leave_the_collector_on(tmp_path: Path) -> None:
    load_trace(FIXTURE)
    show_trace(FIXTURE)
    (tmp_path / "M_debug_tree_FULL_TENSORS.json").write_text("{")
    with pytest.raises(TraceFormatError):
        load_trace(tmp_path)
    assert gc.isenabled()
