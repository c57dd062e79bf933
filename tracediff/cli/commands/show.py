"""``tracediff show TRACE``."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from .._output import add_output_options, emit
from ..exit_codes import exit_codes_help

EXAMPLE = """examples:
  tracediff show traces/port
  tracediff show traces/port --path '**.layers.0' --depth 1
  tracediff show traces/port --path '**.mlp' --format csv -o mlp.csv
  tracediff show msprobe_dump/step0/rank0    # another tool's dump (see tracediff import --help)

--path is a glob over module paths, relative (layers.0.mlp) or full
(LlamaModel.layers.0.mlp); '*' is one path segment, '**' any number (as in
transformers' tp_plan: 'model.layers.*.mlp'). Matching calls are shown
with everything below them (down to --depth levels) and their ancestors.
Tensors holding NaN or Inf are flagged, and the first one is named. Ops
(capture --ops) are listed as '#N op' lines, N their recorded op_index: the
number tracediff align reports for them."""


def register(sub: Any) -> None:
    p = sub.add_parser("show", help="print the call tree of one trace with shapes, dtypes and statistics",
                       description="Print the call tree of one trace: every module call with the shape, dtype,\n"
                                   "mean, std, min and max of its tensors; NaN/Inf flagged.",
                       epilog=EXAMPLE + "\n\n" + exit_codes_help("shown (an incomplete trace is shown and says so)"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", metavar="TRACE", help="trace folder (or its JSON file), or a dump that `tracediff "
                                                  "import` recognises (imported on the fly)")
    p.add_argument("--path", metavar="GLOB", help="only calls whose module path matches GLOB (and their subtrees)")
    p.add_argument("--depth", type=_depth, metavar="N", help="levels shown below the root (or below each match)")
    add_output_options(p, ["table", "json", "csv"])
    p.set_defaults(run=run, skip_teardown=True)  # runs no code of the user's: see cli.process.leave


def _depth(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of levels") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; use 0 for the top only")
    return value


def run(args: argparse.Namespace) -> int:
    from ...render.tree import render_csv, render_json, render_tree
    from ...show import show_trace
    from .._sources import dumps_as_traces
    from ..process import paused_gc

    render = {"json": render_json, "csv": render_csv}.get(args.format, render_tree)
    with dumps_as_traces(args, "show", ("trace",)) as found, paused_gc():  # a line per call and tensor
        view = show_trace(args.trace, path=args.path, depth=args.depth)
        if "trace" in found and found["trace"].imported is not None:
            view = dataclasses.replace(view, trace=found["trace"].given, json_file=found["trace"].given)
        text = render(view)
    emit(text, args.output)
    return 0
