"""``tracediff replay TRACE_A SPEC_B``: run the port's own modules on the reference's recorded inputs."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._output import add_output_options, emit
from ..exit_codes import exit_codes_help

EXAMPLE = """examples:
  tracediff replay traces/orig port.py:build
  tracediff replay traces/orig port.py:build --map rename.json --patch
  tracediff replay traces/orig port.py:build --modules 'model.layers.0.**' --format json -o replay.json
  tracediff replay traces/orig port.py:build --trace-b traces/port --format html -o replay.html

Every module call of B (the model SPEC_B returns) that matches a node of A's
trace runs alone on A's recorded inputs; its outputs are compared with A's
(the local error), and a float64 run of the same module says whether B's math
differs or only its precision (--no-oracle: the tolerance alone decides).
Culprits are the innermost calls whose math differs. SPEC_B is
path/to/script.py:function or package.module:function returning a model or
(model, inputs); the inputs are not used (A's recorded inputs are)."""


def register(sub: Any) -> None:
    p = sub.add_parser("replay", help="run B's modules on A's recorded inputs: which of B's modules is wrong?",
                       description="Replay each module call of B on the inputs A's trace recorded for it, and "
                                   "name the innermost modules whose own math differs from A's.",
                       epilog=EXAMPLE + "\n\n" + exit_codes_help("no culprit", "at least one culprit, or undecided"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace_a", metavar="TRACE_A", help="reference trace folder (or its JSON file), with payloads")
    p.add_argument("spec_b", metavar="SPEC_B", help="script.py:function or package.module:function building B")
    p.add_argument("--map", metavar="FILE", help='rename rules for A\'s paths: {"rename": [[regex, repl], ...]}')
    p.add_argument("--match", choices=("auto", "name", "structure"), default="auto",
                   help="how B's calls pair with A's, as in align: auto (default: top down, on the map, values, "
                        "names and sizes), name (names and --map only), structure (auto without names and --map)")
    p.add_argument("--atol", type=float, metavar="F",
                   help="absolute tolerance on the local error (default: torch.testing's per dtype)")
    p.add_argument("--rtol", type=float, metavar="F",
                   help="relative tolerance on the local error (default: torch.testing's per dtype)")
    p.add_argument("--modules", action="append", metavar="GLOB",
                   help="replay only calls whose module path (relative or full, A's or B's) matches ('*' one "
                        "path segment, '**' any number; repeatable)")
    p.add_argument("--no-oracle", action="store_true", help="skip the float64 runs; a row out of tolerance blames B")
    p.add_argument("--patch", action="store_true",
                   help="for each culprit, the share of the final-output error that disappears with A's output "
                        "in its place")
    p.add_argument("--device", metavar="D", help="run B on this device (cpu, cuda, cuda:1, ...)")
    p.add_argument("--trace-b", metavar="TRACE_B",
                   help="B's own trace: the HTML report then shows align's end-to-end error next to the local error")
    add_output_options(p, ["table", "json", "csv", "markdown", "html"])
    p.add_argument("--all", action="store_true", help="show every replayed call in table/markdown output")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ...replaying import replay
    from ...replaying.spec import load_model

    model = load_model(args.spec_b)
    result = replay(model, args.trace_a, map=args.map, match=args.match, atol=args.atol, rtol=args.rtol,
                    oracle=not args.no_oracle, modules=args.modules, device=args.device, progress=True,
                    patch=args.patch)
    for warning in result.warnings:
        print(f"tracediff replay: warning: {warning}", file=sys.stderr)
    alignment = None
    if args.trace_b:
        from ...alignment import align

        alignment = align(args.trace_a, args.trace_b, map=args.map, match=args.match)
    emit(_render(result, args, alignment), args.output)
    if result.nothing_compared:  # never a pass, never a divergence: the input did not allow a replay
        print(f"tracediff replay: {args.spec_b}: {result.nothing_compared}", file=sys.stderr)
        return 2
    return 0 if result.passed else 1


def _render(result: Any, args: argparse.Namespace, alignment: Any) -> str:
    from ...render import replay as render

    if args.format == "json":
        return render.render_json(result)
    if args.format == "csv":
        return render.render_csv(result)
    if args.format == "markdown":
        return render.render_markdown(result, all_rows=args.all)
    if args.format == "html":
        return render.render_html(result, alignment)
    return render.render_table(result, all_rows=args.all)
