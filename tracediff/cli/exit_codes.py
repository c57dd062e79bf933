"""The four exit codes of every ``tracediff`` command, and the text each ``--help`` shows about them.

Scripts depend on these: 0 passed, 1 diverged (and nothing else), 2 bad
input or usage, 3 internal error. Every command's epilog ends with
:func:`exit_codes_help`, so the codes are documented in one place.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_DIVERGED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3

#: The lines for codes 2 and 3, the same for every command.
EXIT_CODES = """  2  bad input or usage: one line on stderr naming the file and the problem
  3  internal error (a bug in tracediff): one line on stderr; the traceback
     with --debug or TRACEDIFF_DEBUG=1"""


def exit_codes_help(ok: str, diverged: str | None = None) -> str:
    """The ``exit codes:`` paragraph of a command's epilog; ``diverged`` None when the command never exits 1."""
    lines = ["exit codes:", f"  0  {ok}"]
    if diverged is not None:
        lines.append(f"  1  {diverged}")
    return "\n".join(lines) + "\n" + EXIT_CODES
