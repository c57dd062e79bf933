"""``tracediff steps RUN_A RUN_B``: the first training step at which two recorded runs differ."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._output import add_output_options, emit
from ..exit_codes import exit_codes_help

EXAMPLE = """example:
  tracediff steps runs/a runs/b
  tracediff steps runs/a runs/b --atol 1e-6 --format json --output report.json

RUN_A and RUN_B are folders written by tracediff.StepRecorder. Steps are
compared in order, groups in causal order (rngs, batch, params, buffers,
grads, optimizer), tensors in model order. Equal hashes are identical; with
the default --atol 0 --rtol 0 any hash difference diverges; with a tolerance,
differing tensors pass when their recorded statistics (min, max, mean,
abs_mean, std, median) satisfy |b - a| <= atol + rtol * |a|."""


def register(sub: Any) -> None:
    p = sub.add_parser("steps", help="find the first training step at which two recorded runs differ",
                       description="Compare two training records written by tracediff.StepRecorder.",
                       epilog=EXAMPLE + "\n\n" + exit_codes_help(
                           "identical or within tolerance",
                           "a divergence, or undecided: the runs share no step or group to compare"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_a", metavar="RUN_A", help="the reference run folder")
    p.add_argument("run_b", metavar="RUN_B", help="the run folder compared with it")
    p.add_argument("--atol", type=float, default=0.0, metavar="F",
                   help="absolute tolerance on tensor statistics (default: 0, exact)")
    p.add_argument("--rtol", type=float, default=0.0, metavar="F",
                   help="relative tolerance on tensor statistics, relative to RUN_A (default: 0, exact)")
    add_output_options(p, ["table", "json", "csv"])
    p.set_defaults(run=run, skip_teardown=True)  # runs no code of the user's: see cli.process.leave


def run(args: argparse.Namespace) -> int:
    from ...render.steps import render_steps
    from ...steps.compare import compare_steps

    result = compare_steps(args.run_a, args.run_b, atol=args.atol, rtol=args.rtol)
    emit(render_steps(result, args.format), args.output)
    if result.reason is not None:
        print(f"tracediff steps: undecided: {result.reason}", file=sys.stderr)
    return 0 if result.passed else 1

