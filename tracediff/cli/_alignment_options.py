"""The alignment options shared by ``align`` and ``plot``: traces, tolerances, rename map."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..alignment import Alignment


def add_alignment_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help="reference trace folder (or its JSON file), a multi-rank folder "
                                               "(rank{r}/ of one sharded run, read as its global trace), or a dump "
                                               "that `tracediff import` recognises (imported on the fly)")
    parser.add_argument("b", metavar="B", help="trace folder (or dump) to check")
    parser.add_argument("--atol", action="append", metavar="F|PATTERN=F",
                        help="absolute tolerance, global or per module-path glob (repeatable; a glob covers the "
                             "modules under what it matches; '*' is one path segment, '**' any number)")
    parser.add_argument("--rtol", action="append", metavar="F|PATTERN=F",
                        help="relative tolerance, global or per module-path glob (repeatable)")
    parser.add_argument("--map", metavar="FILE",
                        help='rename rules for A\'s paths, and slot renames: {"rename": [[regex, repl], ...], '
                             '"slots": [[module_regex, slot_a, slot_b], ...]} (always applied)')
    parser.add_argument("--match", choices=("auto", "name", "structure"), default="auto",
                        help="how module calls pair: auto (default: top down, on the map, values, names and sizes, "
                             "then layouts), name (names and --map only), structure (auto without names and --map)")
    parser.add_argument("--baseline", metavar="N",
                        help="the reference captured under B's conditions (dtype, device, kernels): errors are "
                             "judged against its noise floor, e.g. tracediff capture SPEC --out N --dtype bfloat16")
    parser.add_argument("--noise-factor", type=float, metavar="K",
                        help="with --baseline, a tensor passes when its error is at most K x its noise floor; "
                             "also the growth that makes a tensor an error source (default 3)")
    parser.add_argument("--ignore", action="append", metavar="PATTERN",
                        help="set aside tensors on purpose: PATH, PATH:SLOT or :SLOT globs, e.g. 'rotary_emb' or "
                             "':inputs.kwargs.position_ids' (repeatable); listed as ignored")
    parser.add_argument("--step", type=int, metavar="K",
                        help="generation traces: compare decode step K alone (0: the prefill); default: every step "
                             "both traces hold, step k against step k")
    parser.add_argument("--logits", action="append", metavar="PATTERN",
                        help="module-path glob whose outputs are logits (repeatable), judged by KL, top-k agreement "
                             "and argmax flips like the model's outputs.logits, e.g. 'lm_head'")
    parser.add_argument("--shards", metavar="RULES",
                        help="declared layouts for multi-rank traces whose tensors carry none (engines without "
                             "DTensors): lines such as 'layers.*.self_attn.q_proj outputs: dim -1 over tp' or "
                             "'layers.*.mlp.down_proj outputs: partial over tp' (see docs/distributed.md)")
    parser.add_argument("--allow-incomplete", action="store_true",
                        help="judge only what both traces hold when one is incomplete (its forward raised, or its "
                             "capture was interrupted or killed); without it an incomplete trace exits 1")


def run_alignment(args: argparse.Namespace, command: str, *, quiet: bool = False) -> Alignment:
    """``tracediff.align`` with the shared options; warnings go to stderr (``quiet``: not printed, as on the
    ranks other than 0 of a distributed run)."""
    from ..alignment import align
    from ..compare.tolerance import parse_cli_tolerances

    result = align(args.a, args.b, atol=parse_cli_tolerances(args.atol, "atol"),
                   rtol=parse_cli_tolerances(args.rtol, "rtol"), map=args.map, match=args.match, progress=True,
                   **_verdict_options(args))
    if quiet:
        return result
    for warning in result.warnings:
        print(f"tracediff {command}: warning: {warning}", file=sys.stderr)
    return result


def _verdict_options(args: argparse.Namespace) -> dict[str, Any]:
    """``baseline``, ``noise_factor`` and ``ignore`` as given; the library's defaults otherwise."""
    options: dict[str, Any] = {"baseline": args.baseline, "ignore": args.ignore,
                                  "allow_incomplete": getattr(args, "allow_incomplete", False),
                                  "step": getattr(args, "step", None), "logits": getattr(args, "logits", None),
                                  "shards": getattr(args, "shards", None),
                                  "distributed": getattr(args, "distributed", False)}
    if args.noise_factor is not None:
        options["noise_factor"] = args.noise_factor
    return options
