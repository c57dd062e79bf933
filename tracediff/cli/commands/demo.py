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
  tracediff demo --generate --out /tmp/tracediff-generate

A reference transformer and a port of it (other module names, weights copied,
one planted bug) run on the same tokens under capture; the traces are aligned
through the rename map the demo writes, and the first divergence is printed.
With --generate, a tiny decoder generates 6 tokens with a KV cache, and its
port has a bug of decode steps only; the alignment names the first diverging
decode step, token position and module. Nothing is downloaded; it takes a few
seconds."""


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
    p.add_argument("--generate", action="store_true",
                   help="the generation story: capture model.generate step by step, and find a bug that shows only "
                        "in decode steps")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ...demo import run_demo
    from ...render.alignment import headline

    if args.generate:
        return _run_generation(args)
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


def _run_generation(args: argparse.Namespace) -> int:
    from ...demo import run_generation_demo
    from ...render.alignment import headline

    demo = run_generation_demo(args.out, overwrite=args.overwrite)
    ref, port, report = (shlex.quote(str(p)) for p in (demo.reference_trace, demo.port_trace, demo.report))
    first = demo.alignment.first_divergence
    found = (f"found it: decode step {first.step}, position {first.position}, {first.module_path_b}: the planted bug"
             if demo.found_bug and first is not None
             else "NOT found: the first divergence is elsewhere (please report this)")
    lines = [
        "tracediff demo --generate: a tiny decoder generating with a KV cache, and a port of it with a bug of decode "
        "steps only",
        f"  reference trace  {demo.reference_trace}",
        f"  port trace       {demo.port_trace}",
        "",
        *headline(demo.alignment),
        "",
        f"planted bug: in decode steps, {demo.bug_module} rotates the new token one position late (the prefill "
        "is right)",
        found,
        f"HTML report: {demo.report}",
        "",
        "try next:",
        f"  tracediff align {ref} {port} --step {demo.bug_step}",
        f"  tracediff align {ref} {port} --step 0   # the prefill passes",
        f"  tracediff align {ref} {port} --format html -o {report}",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0 if demo.found_bug else 1
