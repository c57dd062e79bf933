"""Progress bars: drawn on a terminal's stderr only, and gone when closed."""

from __future__ import annotations

import io
import sys

import pytest

from tracediff.files.progress import progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_bar_is_drawn_when_stderr_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    with progress_bar(True, desc="replay", unit=" calls", total=3) as bar:
        bar.update(1)
    assert stderr.getvalue() == ""


def test_no_bar_is_drawn_when_not_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = _Terminal()
    monkeypatch.setattr(sys, "stderr", stderr)
    bar = progress_bar(False, desc="replay", unit=" calls", total=3)
    bar.update(1)
    bar.close()
    assert stderr.getvalue() == ""


def test_a_terminal_gets_a_bar_that_is_cleared_when_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tqdm", reason="the bars are tqdm's")
    stderr = _Terminal()
    monkeypatch.setattr(sys, "stderr", stderr)
    bar = progress_bar(True, desc="replay", unit=" calls", total=4)
    bar.update(2)
    bar.close()
    drawn = stderr.getvalue()
    assert drawn.startswith("\rreplay:") and "/4 " in drawn and " calls/s" in drawn
    assert drawn.rstrip("\r").rsplit("\r", 1)[-1].strip() == ""  # leave=False: the line is blanked on close
