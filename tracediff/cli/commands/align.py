"""``tracediff align A B``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .._alignment_options import add_alignment_options
from .._output import add_output_options, emit
from ..exit_codes import exit_codes_help

EXAMPLE = """examples:
  tracediff align traces/orig traces/port
  tracediff align traces/orig traces/port --atol 1e-5 --atol 'layers.*.mlp=1e-4' --format json
  tracediff align traces/orig traces/port --map rename.json --format html -o report.html
  tracediff align traces/orig traces/port --suggest-map rename.json
  tracediff align traces/ref-fp32 traces/port-bf16 --baseline traces/ref-bf16   # judge against bf16 noise
  tracediff align traces/ref traces/port --ignore 'rotary_emb' --next 1   # step past a benign difference
  tracediff align msprobe_dump/ref msprobe_dump/port   # dumps of other tools: see tracediff import --help
  torchrun --nproc-per-node 4 -m tracediff align traces/tp1 traces/tp4 --distributed   # each rank reads its own"""


def register(sub: Any) -> None:
    p = sub.add_parser("align", help="find where trace B first departs from reference trace A",
                       description="Compare trace B (the port) against reference trace A and report the first "
                                   "diverging tensor in execution order.",
                       epilog=EXAMPLE + "\n\n" + exit_codes_help(
                           "every compared tensor within tolerance and both traces complete",
                           "something diverges or cannot be read, or undecided: nothing was compared, or a "
                           "trace is incomplete (without --allow-incomplete)"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_alignment_options(p)  # A, B and --baseline may also be dumps `tracediff import` reads (imported on the fly)
    p.add_argument("--suggest-map", metavar="FILE",
                   help="write every rename rule inferred from the pairs found by structure or layout (the "
                        "console shows the first 10 and the count); pass the file back with --map")
    add_output_options(p, ["table", "json", "csv", "markdown", "html"])
    p.add_argument("--all", action="store_true", help="show every row (and every error source) in table/markdown "
                                                      "output")
    p.add_argument("--next", type=int, default=0, metavar="N",
                   help="centre the table on error source N+1 (0: the first divergence), to step past a benign "
                        "difference; the sources are listed in the report")
    p.add_argument("--distributed", action="store_true",
                   help="under torchrun --nproc-per-node N (B a multi-rank folder of N ranks): each rank compares the "
                        "shards of its own rank folder, rank 0 merges the rows and writes the report; the other "
                        "ranks print nothing and exit with the same code (see docs/distributed.md)")
    p.set_defaults(run=run, skip_teardown=True)  # runs no code of the user's: see cli.process.leave


def run(args: argparse.Namespace) -> int:
    if not args.distributed:
        return _run(args, root=True)
    from ...alignment.distributed import distributed_run, wait_for_all

    with distributed_run() as group:  # one group for the alignment and the wait below
        code = _run(args, root=group.is_root)
        wait_for_all()  # no rank exits before rank 0 has written the report (torchrun stops the others)
    return code


def _run(args: argparse.Namespace, *, root: bool) -> int:
    """``root``: this process reports (rank 0 of a distributed run, or no launch)."""
    from .._alignment_options import run_alignment
    from .._sources import dumps_as_traces, given_paths
    from ..process import paused_gc

    # dumps imported for the time of the run; a row per tensor, nodes per call: nothing is garbage worth scanning
    with dumps_as_traces(args, "align", ("a", "b", "baseline")) as found, paused_gc():
        result = given_paths(run_alignment(args, "align", quiet=not root), found)
        if not root:  # rank 0 writes the report; every rank exits alike
            return 0 if result.passed else 1
        return _report(result, args)


def _report(result: Any, args: argparse.Namespace) -> int:
    from ...files.atomic import write_json

    if args.suggest_map:
        from ...render.matching import suggested_map

        suggestion = suggested_map(result)
        write_json(Path(args.suggest_map), suggestion, user_target=True)
        if not result.suggested_rename and not result.suggested_slots:
            print(f"tracediff align: module paths lined up by name; {args.suggest_map} has no rules",
                  file=sys.stderr)
        elif args.format == "table":  # other formats keep stdout for the report alone
            slots = f", {len(result.suggested_slots)} slot rules" if result.suggested_slots else ""
            layout = f" and {len(suggestion['layout'])} layout pairings" if "layout" in suggestion else ""
            print(f"wrote {len(result.suggested_rename)} rename rules{slots}{layout} to {args.suggest_map}")
    emit(_render(result, args), args.output)
    if result.verdict == "undecided":
        print(f"tracediff align: undecided: {result.reason}", file=sys.stderr)
    return 0 if result.passed else 1


def _render(result: Any, args: argparse.Namespace) -> str:
    from ...render.alignment import render_csv, render_json, render_markdown, render_table

    if args.format == "json":
        return render_json(result)
    if args.format == "csv":
        return render_csv(result)
    if args.format == "markdown":
        return render_markdown(result, all_rows=args.all, focus=args.next)
    if args.format == "html":
        from ...render.html import render_html

        return render_html(result)
    return render_table(result, all_rows=args.all, focus=args.next)
