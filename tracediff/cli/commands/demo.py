"""``tracediff demo``: the porting story on an embedded example."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from ..exit_codes import exit_codes_help

EXAMPLE = """examples:
  tracediff demo
  tracediff demo --out /tmp/tracediff-demo --overwrite

A reference transformer and a port of it (other module names, weights copied,
one planted bug) run on the same tokens under capture; the traces are aligned
through the rename map the demo writes, and the first divergence is printed.
Nothing is downloaded; it takes a few seconds."""


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the porting story on a built-in example (start here)",
                       description="Capture a reference model and a buggy port of it, align them, and write\n"
                                   "the traces, the rename map and an HTML report into one folder.",
                       epilog=EXAMPLE + "\n\n" + exit_codes_help(
                           "the demo ran and found the planted bug", "it did not find it"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="tracediff-demo", metavar="DIR",
                   help="demo folder (default: tracediff-demo in the current directory)")
    p.add_argument("--overwrite", action="store_true", help="replace the files of an earlier demo in DIR")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ...demo import run_demo
    from ...render.alignment import headline

    demo = run_demo(args.out, overwrite=args.overwrite)
    ref, port, rename, report = (shlex.quote(str(p)) for p in (demo.reference_trace, demo.port_trace,
                                                               demo.rename_map, demo.report))
    lines = [
        "tracediff demo: a reference transformer, and a port of it with other module names and one planted bug",
        f"  reference trace  {demo.reference_trace}",
        f"  port trace       {demo.port_trace}",
        f"  rename map       {demo.rename_map}",
        "",
        *headline(demo.alignment),
        "",
        f"planted bug: {demo.bug_module} rotates interleaved pairs instead of halves (rotary embedding)",
        "found it: the first divergence is the planted bug" if demo.found_bug
        else "NOT found: the first divergence is elsewhere (please report this)",
        f"HTML report: {demo.report}",
        "",
        "try next:",
        f"  tracediff show {port} --path 'layers.0.self_attn*'",
        f"  tracediff align {ref} {port} --map {rename}",
        f"  tracediff align {ref} {port} --map {rename} --format html -o {report}",
        f"  tracediff plot {ref} {port} --map {rename} -o errors.png",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0 if demo.found_bug else 1
