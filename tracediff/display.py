"""Short reprs and notebook summaries for result objects.

A result object (``Alignment``, ``StepComparison``, ``TraceView``...) holds
thousands of rows; its ``repr`` must stay one short line and its Jupyter view
(``_repr_html_``) a small table: a title, a verdict and a few labelled facts
such as the first divergence. Both are built here from ``(label, value)``
pairs, so every result object looks alike::

    def __repr__(self) -> str:
        return short_repr(self, passed=self.passed, compared=len(self.rows))

    def _repr_html_(self) -> str:
        return summary_html("Alignment", [("compared", len(self.rows))], verdict=self.verdict)

Values are shortened to ``MAX_VALUE_CHARS`` characters and HTML-escaped; the
module imports nothing beyond the standard library.

It also holds the renderer registry: ``result.to_html()`` looks its renderer
up with ``renderer_for(result, "html")``, and :mod:`tracediff.render` fills the
registry with ``register_renderer`` when imported, so core result types never
import a renderer.
"""

from __future__ import annotations

import html
import importlib
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["MAX_VALUE_CHARS", "shorten", "short_repr", "summary_html", "register_renderer", "renderer_for"]

MAX_VALUE_CHARS = 120


def shorten(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, ending in ``...`` when cut."""
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def short_repr(obj: object, /, **fields: Any) -> str:
    """``ClassName(key=value, ...)`` with each value's repr shortened; one line whatever the object holds."""
    parts = ", ".join(f"{key}={shorten(repr(value))}" for key, value in fields.items())
    return f"{type(obj).__name__}({parts})"


def summary_html(title: str, facts: Iterable[tuple[str, Any]], *, verdict: str | None = None) -> str:
    """A small HTML table: ``title`` with the result's ``verdict`` as a badge (``passed``, ``diverged``,
    ``undecided``...; none when None), one row a fact.

    ``None`` values are shown as an em dash; every label and value is escaped.
    """
    badge = ""
    if verdict is not None:
        colour = {"passed": "#1a7f37", "diverged": "#cf222e"}.get(verdict, "#9a6700")  # amber: no verdict reached
        badge = f' <span style="color:{colour};font-weight:bold">{html.escape(verdict.upper())}</span>'
    rows = "".join(
        f'<tr><th style="text-align:left">{html.escape(str(label))}</th>'
        f'<td style="text-align:left">{html.escape(shorten(_text(value), 400))}</td></tr>'
        for label, value in facts
    )
    return f"<div><strong>{html.escape(title)}</strong>{badge}<table>{rows}</table></div>"


def _text(value: Any) -> str:
    if value is None:
        return "\u2014"
    return value if isinstance(value, str) else str(value)


# Renderers registered by the render package, so that result types never import it. Keyed by the result's
# class name and a format name ("html"); filled when ``tracediff.render`` is imported.
RENDER_PACKAGE = "tracediff.render"
_RENDERERS: dict[tuple[str, str], Callable[[Any], str]] = {}


def register_renderer(type_name: str, fmt: str, render: Callable[[Any], str]) -> None:
    """Make ``render(result)`` the ``fmt`` renderer of results whose class is named ``type_name``."""
    _RENDERERS[(type_name, fmt)] = render


def renderer_for(obj: object, fmt: str) -> Callable[[Any], str]:
    """The registered ``fmt`` renderer of ``obj``'s class (importing ``RENDER_PACKAGE`` once to fill the registry).

    Raises ``LookupError`` when none is registered.
    """
    key = (type(obj).__name__, fmt)
    if key not in _RENDERERS:
        importlib.import_module(RENDER_PACKAGE)  # the render package registers its renderers on import
    try:
        return _RENDERERS[key]
    except KeyError:
        raise LookupError(f"no {fmt} renderer for {type(obj).__name__}") from None
