"""The alignment options shared by ``align`` and ``plot``: traces, tolerances, rename map."""

from __future__ import annotations

import argparse
import sys

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..alignment import Alignment


def add_alignment_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help="reference trace folder (or its JSON file)")
    parser.add_argument("b", metavar="B", help="trace folder to check")
    parser.add_argument("--atol", action="append", metavar="F|PATTERN=F",
                        help="absolute tolerance, global or per module-path glob (repeatable)")
    parser.add_argument("--rtol", action="append", metavar="F|PATTERN=F",
                        help="relative tolerance, global or per module-path glob (repeatable)")
    parser.add_argument("--map", metavar="FILE",
                        help='rename rules for A\'s paths: {"rename": [[regex, repl], ...]}')


def run_alignment(args: argparse.Namespace, command: str) -> Alignment:
    """``tracediff.align`` with the shared options; warnings go to stderr."""
    from ..alignment import align
    from ..alignment.matching import load_rename_file
    from ..alignment.tolerance import parse_cli_tolerances

    rename = load_rename_file(args.map) if args.map else None
    result = align(args.a, args.b, atol=parse_cli_tolerances(args.atol, "atol"),
                   rtol=parse_cli_tolerances(args.rtol, "rtol"), rename=rename, progress=True)
    for warning in result.warnings:
        print(f"tracediff {command}: warning: {warning}", file=sys.stderr)
    return result
