"""Text that is safe to print: no terminal control sequences, no unencodable characters.

Module paths, slot names and messages come from traces, which may be crafted:
an ESC byte in a module name would otherwise clear the screen or set the
terminal title when ``tracediff show`` prints it, and a lone surrogate would
crash the UTF-8 encoder of stdout.
"""

from __future__ import annotations

import re

# C0 controls except tab and newline, DEL, C1 controls (0x9b is a one-byte CSI on some terminals),
# and the bidirectional overrides that reorder what the reader sees.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROL_OR_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with control characters shown as ``\\xNN`` and lone surrogates as ``\\udcNN``."""
    text = (_CONTROL if keep_newlines else _CONTROL_OR_NEWLINE).sub(_escape, text)
    return encodable(text)


def encodable(text: str) -> str:
    """``text`` with lone surrogates (which UTF-8 cannot encode) replaced by ``\\udcNN`` escapes."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


_MARKDOWN_SPECIAL = re.compile(r"[<&|]")


def markdown_text(text: str) -> str:
    """``text`` for a Markdown table cell: no raw HTML (``<``, ``&`` escaped) and no table breaks (``|``).

    ``>`` alone opens no tag and stays (the ``>>`` marker of the first divergence); underscores inside
    module names start no emphasis in GitHub Markdown and stay readable.
    """
    escaped = _MARKDOWN_SPECIAL.sub(lambda m: {"<": "&lt;", "&": "&amp;", "|": "\\|"}[m.group()], text)
    return printable(escaped)
