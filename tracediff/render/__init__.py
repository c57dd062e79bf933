"""Renderers: turn result objects into text, JSON, CSV, HTML or images. Nothing here computes.

Importing this package registers the HTML renderer that ``Alignment.to_html()``
looks up (see :mod:`tracediff.display`); the renderer module itself is
imported only when a report is rendered.
"""

from __future__ import annotations

from typing import Any

from ..display import register_renderer


def _alignment_html(result: Any) -> str:
    from .html import render_html

    return render_html(result)


register_renderer("Alignment", "html", _alignment_html)
