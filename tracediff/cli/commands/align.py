"""``tracediff align A B``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .._alignment_options import add_alignment_options
from .._output import add_output_options, emit

EXAMPLE = """examples:
  tracediff align traces/orig traces/port
  tracediff align traces/orig traces/port --atol 1e-5 --atol 'layers.*.mlp=1e-4' --format json
  tracediff align traces/orig traces/port --map rename.json --format html -o report.html
  tracediff align traces/orig traces/port --suggest-map rename.json

exit codes: 0 every compared tensor within tolerance, 1 something diverges,
2 bad input or usage."""


def register(sub: Any) -> None:
    p = sub.add_parser("align", help="find where trace B first departs from reference trace A",
                       description="Compare trace B (the port) against reference trace A and report the first "
                                   "diverging tensor in execution order.",
                       epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_alignment_options(p)
    p.add_argument("--suggest-map", metavar="FILE", help="write the rename rules inferred by structural matching")
    add_output_options(p, ["table", "json", "csv", "markdown", "html"])
    p.add_argument("--all", action="store_true", help="show every row in table/markdown output")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..._io import write_json

    from .._alignment_options import run_alignment

    result = run_alignment(args, "align")
    if args.suggest_map:
        write_json(Path(args.suggest_map), {"rename": [list(rule) for rule in result.suggested_rename]})
        if not result.suggested_rename:
            print(f"tracediff align: module paths lined up by name; {args.suggest_map} has no rules",
                  file=sys.stderr)
    emit(_render(result, args), args.output)
    return 0 if result.passed else 1


def _render(result: Any, args: argparse.Namespace) -> str:
    from ...render.alignment import render_csv, render_json, render_markdown, render_table

    if args.format == "json":
        return render_json(result)
    if args.format == "csv":
        return render_csv(result)
    if args.format == "markdown":
        return render_markdown(result, all_rows=args.all)
    if args.format == "html":
        from ...render.html import render_html

        return render_html(result)
    return render_table(result, all_rows=args.all)
