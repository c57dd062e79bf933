"""Every result object has a one-line repr and a small, escaped Jupyter summary (``_repr_html_``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import tracediff
from tracediff.display import short_repr, shorten, summary_html
from tracediff.show import show_trace


def _one_line(text: str, limit: int = 800) -> bool:
    return "\n" not in text and len(text) < limit


def test_helpers_shorten_and_escape() -> None:
    assert shorten("x" * 10, 5) == "xx..." and shorten("abc", 5) == "abc"
    assert short_repr(object(), name="a" * 500).startswith("object(name='aaa")
    assert _one_line(short_repr(object(), name="a" * 500), 200)
    page = summary_html("T<1>", [("a&b", "<b>"), ("none", None)], verdict="diverged")
    assert "T&lt;1&gt;" in page and "a&amp;b" in page and "&lt;b&gt;" in page and "DIVERGED" in page
    assert "\u2014" in page and "PASSED" not in page


def _toy() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_capture_session_and_trace_view(tmp_path: Path) -> None:
    model = _toy()
    with tracediff.capture(model, tmp_path / "t") as session:
        model(torch.ones(3, 4))
    text = repr(session)
    assert _one_line(text) and text.startswith("CaptureSession(trace_dir=") and "complete=True" in text
    assert "complete" in session._repr_html_() and str(tmp_path / "t") in session._repr_html_()

    view = show_trace(tmp_path / "t")
    text = repr(view)
    assert _one_line(text) and text.startswith("TraceView(trace=") and f"calls={len(view.nodes)}" in text
    assert "Sequential" in view._repr_html_()


def test_step_comparison(tmp_path: Path) -> None:
    for name, lr in (("a", 0.01), ("b", 0.02)):
        model = _toy()
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        with tracediff.StepRecorder(model, tmp_path / name, optimizer=opt) as recorder:
            for _ in range(2):
                with recorder.step({"x": torch.ones(2, 4)}):
                    model(torch.ones(2, 4)).sum().backward()
                    opt.step()
                    opt.zero_grad()
    result = tracediff.compare_steps(tmp_path / "a", tmp_path / "b")
    text = repr(result)
    assert _one_line(text) and text.startswith("StepComparison(passed=False, steps=2")
    assert "optimizer defaults.lr" in text
    page = result._repr_html_()
    assert "DIVERGED" in page and "defaults.lr" in page
