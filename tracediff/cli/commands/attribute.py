"""``tracediff attribute TRACE_A SPEC_B``: which calls of a quantized model cost the most of its final error?"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._output import add_output_options, emit
from ..exit_codes import exit_codes_help

EXAMPLE = """examples:
  tracediff attribute traces/float quantized.py:build
  tracediff attribute traces/float quantized.py:build --modules leaves --budget 4
  tracediff attribute traces/float quantized.py:build --modules 'model.layers.*.mlp' --format json -o rank.json
  tracediff attribute traces/float quantized.py:build --format html -o rank.html

A is the float model's trace (captured with payloads); SPEC_B is
path/to/script.py:function or package.module:function returning the
quantized or low-precision model B, or (model, inputs) (A's recorded inputs
are used). Each ranked call of B runs alone on A's inputs (its local error),
then B's forward runs from that call on with every later call's math
restored (plain kernels in place of quantized ones): the final error left
is what that call causes on its own (its share). --modules: layers
(default; one partial forward per decoder layer), leaves (one per Linear,
Embedding, norm: about 7 per layer) or globs ('*' is one path segment, '**'
any number, as in transformers' tp_plan)."""


def register(sub: Any) -> None:
    p = sub.add_parser("attribute", help="rank the calls of a quantized model by the share of the final error "
                                         "they cause",
                       description="Rank the module calls of a quantized or low-precision model B by the share of "
                                   "its final-output error each causes, with its local error on A's inputs.",
                       epilog=EXAMPLE + "\n\n" + exit_codes_help("the ranking was computed"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace_a", metavar="TRACE_A", help="the float model's trace (folder or JSON file), with payloads")
    p.add_argument("spec_b", metavar="SPEC_B", help="script.py:function or package.module:function building B")
    p.add_argument("--modules", action="append", metavar="GLOB",
                   help="what to rank: layers (default), leaves, or globs over B's module paths ('*' one path "
                        "segment, '**' any number; repeatable)")
    p.add_argument("--budget", type=int, metavar="N",
                   help="also list the N calls whose restoration, together, removes the most of the final error "
                        "(greedy, measured jointly: up to N forwards per ranked call)")
    p.add_argument("--device", metavar="D", help="run B on this device (cpu, cuda, cuda:1, ...)")
    add_output_options(p, ["table", "json", "csv", "markdown", "html"])
    p.add_argument("--all", action="store_true", help="show every ranked call in table/markdown output")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ...attribution import attribute
    from ...replaying.spec import load_model

    model = load_model(args.spec_b)
    result = attribute(model, args.trace_a, modules=args.modules or "layers", budget=args.budget,
                       device=args.device)
    for warning in result.warnings:
        print(f"tracediff attribute: warning: {warning}", file=sys.stderr)
    if not result.ranking:  # nothing ranked is never a result: say why, as bad input
        why = "; ".join(f"{s.module_path} (call {s.call_index}): {s.reason}" for s in result.skipped[:3])
        print(f"tracediff attribute: {args.spec_b}: no call could be ranked ({why or 'none selected'})",
              file=sys.stderr)
        return 2
    emit(_render(result, args), args.output)
    return 0


def _render(result: Any, args: argparse.Namespace) -> str:
    from ...render import attribution as render

    if args.format == "json":
        return render.render_json(result)
    if args.format == "csv":
        return render.render_csv(result)
    if args.format == "markdown":
        return render.render_markdown(result, all_rows=args.all)
    if args.format == "html":
        return render.render_html(result)
    return render.render_table(result, all_rows=args.all)
