"""``tracediff plot A B -o errors.png``."""

from __future__ import annotations

import argparse
from typing import Any

from .._alignment_options import add_alignment_options
from ..exit_codes import exit_codes_help

EXAMPLE = """examples:
  tracediff plot traces/orig traces/port -o errors.png
  tracediff plot traces/orig traces/port --map rename.json --atol 1e-4 -o errors.svg

The error of every compared tensor along B's execution order (log scale),
the atol line and the first divergence, as PNG, SVG or PDF. Needs matplotlib:
pip install 'tracediff[plot]'. The alignment options are those of align."""


def register(sub: Any) -> None:
    p = sub.add_parser("plot", help="draw the error of every tensor along execution order (PNG/SVG/PDF)",
                       description="Align trace B against reference trace A and draw the error-growth plot.",
                       epilog=EXAMPLE + "\n\n" + exit_codes_help(
                           "the plot was written (whether or not the traces diverge)"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_alignment_options(p)
    p.add_argument("--output", "-o", required=True, metavar="FILE", help="image to write: .png, .svg or .pdf")
    p.add_argument("--title", help="plot title (default: the two model names and the verdict)")
    p.set_defaults(run=run, skip_teardown=True)  # runs no code of the user's: see cli.process.leave


def run(args: argparse.Namespace) -> int:
    from ...render.plot import check_plot_target, plot_alignment
    from .._alignment_options import run_alignment
    from .._sources import dumps_as_traces, given_paths

    check_plot_target(args.output)  # fail before the alignment work when matplotlib is missing
    with dumps_as_traces(args, "plot", ("a", "b", "baseline")) as sources:
        result = given_paths(run_alignment(args, "plot"), sources)
    path = plot_alignment(result, args.output, title=args.title)
    first = result.first_divergence
    found = f"first divergence: {first.module_path_b} {first.tensor}" if first is not None else \
        ("every compared tensor within tolerance" if result.passed else "some tensors could not be read")
    print(f"wrote {path} ({len(result.rows)} tensors; {found})")
    return 0
