"""The op-level capture options of ``tracediff capture``: ``--ops`` and its filters."""

from __future__ import annotations

import argparse
from typing import Any


def add_ops_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--ops``, ``--ops-include``, ``--ops-exclude``, ``--ops-in`` and ``--ops-min-numel``."""
    group = parser.add_argument_group("op-level capture (any of these turns it on)")
    group.add_argument("--ops", action="store_true",
                       help="also record the torch functions each module's own code calls (views and shape "
                            "queries excepted), as op nodes under the module call")
    group.add_argument("--ops-include", action="append", default=[], metavar="GLOB",
                       help="record only ops whose qualified name matches (repeatable; 'matmul' matches "
                            "torch.matmul and torch.Tensor.matmul; replaces the default exclusion of views)")
    group.add_argument("--ops-exclude", action="append", default=[], metavar="GLOB",
                       help="do not record ops whose name matches (repeatable)")
    group.add_argument("--ops-in", action="append", default=[], metavar="GLOB",
                       help="record ops only inside module calls whose path matches, and their submodules "
                            "(repeatable; e.g. 'layers.1.self_attn', 'model.layers.*.self_attn': '*' is one path "
                            "segment, '**' any number)")
    group.add_argument("--ops-min-numel", type=int, default=0, metavar="N",
                       help="skip ops whose tensor outputs all have fewer than N elements (default 0)")


def ops_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords of ``tracediff.capture`` that the op options stand for."""
    on = args.ops or bool(args.ops_include or args.ops_exclude or args.ops_in)
    return {"ops": list(args.ops_include) if args.ops_include else on, "ops_exclude": list(args.ops_exclude),
            "ops_in": list(args.ops_in), "ops_min_numel": args.ops_min_numel}
