"""Output options shared by every command that renders a result."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..files.atomic import write_text


def add_output_options(parser: argparse.ArgumentParser, formats: list[str], default: str = "table") -> None:
    parser.add_argument("--format", choices=formats, default=default, help=f"output format (default: {default})")
    parser.add_argument("--output", "-o", metavar="FILE", help="write to FILE (atomically) instead of stdout")


def emit(text: str, output: str | None) -> None:
    """Print ``text``, or write it to ``output`` atomically."""
    if output:
        write_text(Path(output), text if text.endswith("\n") else text + "\n")
    else:
        from ..render.text import encodable

        sys.stdout.write(encodable(text if text.endswith("\n") else text + "\n"))
