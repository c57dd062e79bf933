"""``tracediff`` entry point: parse arguments, call one library function, render, exit.

Exit codes: 0 passed, 1 a divergence was found (or a verification failed),
2 bad input or usage, with one line on stderr and no traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from .._version import __version__
from ..errors import TracediffError
from . import commands

EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tracediff",
        description="Find where two implementations of a neural network first disagree.",
        epilog="Start with `tracediff demo`; every command has --help with an example.",
    )
    parser.add_argument("--version", action="version", version=f"tracediff {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in commands.ALL:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return int(args.run(args))
    except TracediffError as e:
        print(f"tracediff {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"tracediff {args.command}: interrupted", file=sys.stderr)
        return 130


def entry_point() -> None:
    sys.exit(main())
