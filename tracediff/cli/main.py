"""``tracediff`` entry point: parse arguments, call one library function, render, exit.

Exit codes (see :mod:`tracediff.cli.exit_codes`): 0 passed, 1 a divergence
was found (or a verification failed), 2 bad input or usage, with one line on
stderr and no traceback, 3 an internal error, one line on stderr and the
traceback only with ``--debug`` or ``TRACEDIFF_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from .._version import __version__
from ..errors import TracediffError
from . import commands
from .exit_codes import EXIT_BAD_INPUT, EXIT_CODES, EXIT_DIVERGED, EXIT_INTERNAL, EXIT_OK
from .process import leave, stop_cyclic_gc

__all__ = ["EXIT_BAD_INPUT", "EXIT_DIVERGED", "EXIT_INTERNAL", "EXIT_OK", "build_parser", "main"]
_DEBUG_HELP = "on an internal error, print the traceback (also TRACEDIFF_DEBUG=1)"


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command``, that subcommand alone (its options parse the same, and the
    others' hundred options are not built on the way to a run)."""
    parser = _Parser(
        prog="tracediff",
        description="Find where two implementations of a neural network first disagree.",
        epilog="Start with `tracediff demo`; every command has --help with an example.\n\n"
               "exit codes:\n  0  passed\n  1  diverged\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tracediff {__version__}")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in commands.BY_NAME.items():
        if command is None or name == command:
            module.register(sub)
    for registered in sub.choices.values():  # also accepted after the command: `tracediff align A B --debug`
        registered.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
    return parser


def _named_command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` runs, when it names one after nothing but ``--debug``; else None (help, version,
    a mistyped command: the whole parser answers)."""
    for token in argv:
        if token != "--debug":
            return token if token in commands.BY_NAME else None
    return None


def _debug_requested(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get("TRACEDIFF_DEBUG", "") not in ("", "0")


def _one_line(text: str) -> str:
    """``text`` on one printable line: control characters and lone surrogates escaped."""
    from ..render.text import printable

    return printable(" ".join(text.split()))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    return _run(argv)[0]


def _run(argv: Sequence[str] | None, *, whole_process: bool = False) -> tuple[int, argparse.Namespace | None]:
    """The exit code, and the parsed arguments (None when there was no command to run).

    ``whole_process``: the command is all this process will do (``entry_point``). A command that ends without
    the teardown (:func:`tracediff.cli.process.leave`) then also runs without the cyclic garbage collector
    (:func:`tracediff.cli.process.stop_cyclic_gc`).
    """
    parser = build_parser(_named_command(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT, None
    if whole_process and getattr(args, "skip_teardown", False):
        stop_cyclic_gc()
    return _run_command(args), args


def _run_command(args: argparse.Namespace) -> int:
    try:
        code = int(args.run(args))
        return code if code in (EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT) else EXIT_INTERNAL
    except TracediffError as e:
        print(f"tracediff {args.command}: error: {_one_line(str(e))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP during a capture: 128 + the signal, as a shell does
        signum = getattr(e, "signum", 2)
        partial = getattr(e, "partial_trace", None)
        where = f"; the partial trace (marked incomplete) is in {partial}" if partial is not None else ""
        print(f"tracediff {args.command}: interrupted{f' by {e}' if signum != 2 else ''}{_one_line(where)}",
              file=sys.stderr)
        return 128 + signum
    except Exception as e:  # noqa: BLE001 - a bug must never look like a divergence (exit 1)
        if _debug_requested(args):
            traceback.print_exc()
        where = _innermost_frame(e)
        message = _one_line(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
        print(f"tracediff {args.command}: internal error: {message}{where}; please report it with the command"
              + ("" if _debug_requested(args) else " (run with --debug for the traceback)"), file=sys.stderr)
        return EXIT_INTERNAL


def _innermost_frame(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {os.path.basename(last.filename)}:{last.lineno})"


def entry_point() -> None:
    code, args = _run(None, whole_process=True)
    if args is None or not getattr(args, "skip_teardown", False):
        sys.exit(code)
    leave(code)
