"""``tracediff import KIND SRC --out DIR``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._output import emit
from ..exit_codes import exit_codes_help

COMMAND = "import"  # the module cannot be named after the keyword
EXAMPLE = """examples:
  tracediff import msprobe msprobe_dump/step0/rank0 --out traces/port
  tracediff import tensors dumps/reference --out traces/reference
  tracediff import tensors dumps/port --out traces/port --pattern 'step{call}/{module}/{io}'
  tracediff import polygraphy onnxrt_outputs.json --out traces/onnxrt   # polygraphy run --save-outputs
  tracediff import auto dumps/port --out traces/port     # the kind the folder's files say
  tracediff align traces/reference traces/port

Kinds: msprobe (Ascend msprobe's dump.json with its .pt/.npy files, or statistics
only), polygraphy (the JSON of polygraphy run --onnx-outputs mark all --save-outputs),
tensors (a folder of .npy, .npz, .safetensors, .pt/.pth files named by module
path: model.layers.0.mlp.npy, layers/0/mlp/output.pt, 003_layers.0.mlp.npy). --pattern
fields: {module} {call} {io} {index} {order}, and * for any text in one folder level.
align and show also take a dump directly when its kind is clear. Nothing is written
into SRC; .pt files are read with torch.load(weights_only=True) only."""


def register(sub: Any) -> None:
    p = sub.add_parser(COMMAND, help="write another tool's dump (msprobe, a folder of tensors) as a trace",
                       description="Read a dump written by another tool and write it as a tracediff trace "
                                   "(payloads as safetensors), for align, show and replay.",
                       epilog=EXAMPLE + "\n\n" + exit_codes_help("imported"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", metavar="KIND", choices=("auto", "tensors", "msprobe", "polygraphy"),
                   help="the dump's kind: tensors, msprobe, polygraphy, or auto (recognised from the folder)")
    p.add_argument("src", metavar="SRC", help="the dump folder (polygraphy: also its JSON file)")
    p.add_argument("--out", required=True, metavar="DIR", help="trace folder to write (must be empty unless "
                                                                 "--overwrite)")
    p.add_argument("--pattern", metavar="TEMPLATE",
                   help="tensors only: how a file's path (without suffix) names module, call and slot, e.g. "
                        "'{order}_{module}.{io}' (default: read from the names, see docs/importers.md)")
    p.add_argument("--model-name", default="Model", metavar="NAME", help="the root module's name (default Model)")
    p.add_argument("--overwrite", action="store_true", help="replace a trace already in DIR")
    p.add_argument("--format", choices=["table", "json"], default="table", help="output format (default: table)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ...errors import DumpFormatError
    from ...importers import detect_kind, import_dump

    kind = args.kind
    if kind == "auto":
        kind = detect_kind(args.src)
        if kind is None:
            raise DumpFormatError(f"{args.src}: not a dump tracediff recognises (no msprobe dump.json, no tensor "
                                  "files, no Polygraphy JSON); name the kind: tracediff import tensors|msprobe|"
                                  "polygraphy")
    result = import_dump(kind, args.src, out=args.out, pattern=args.pattern, model_name=args.model_name,
                         overwrite=args.overwrite)
    for note in result.notes:
        print(f"tracediff import: note: {note}", file=sys.stderr)
    if args.format == "json":
        emit(json.dumps(result.to_dict(), indent=2), None)
    else:
        size = f"{result.payload_bytes / 1e6:.1f} MB" if result.payload_bytes >= 1e5 else \
            f"{result.payload_bytes:,} bytes"
        emit(f"imported {result.calls} calls ({result.tensors} tensors, {size} of payloads) from the {kind} dump "
             f"{result.source} into {result.out} in {result.seconds:.2f} s; calls ordered by {result.order}", None)
    return 0
