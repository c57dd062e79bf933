"""``tracediff capture SPEC --out DIR``."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Mapping
from typing import Any

from .._ops_options import add_ops_options, ops_kwargs
from ..exit_codes import exit_codes_help

EXAMPLE = """example:
  tracediff capture my_port.py:build --out traces/port --inputs inputs.safetensors
  tracediff capture mypkg.reference:build --out traces/orig --save-inputs inputs.safetensors
  tracediff capture mypkg.reference:build --out traces/ref-bf16 --dtype bfloat16   # a baseline
  torchrun --nproc-per-node 2 -m tracediff capture my_tp.py:build --ranks all --out traces/tp2

SPEC names a function returning (model, inputs); inputs is a tensor, a tuple
of positional arguments or a dict of keyword arguments. The forward runs once
under torch.no_grad(). The model may be an mlx.nn.Module (inputs: mx.array);
see docs/frameworks.md for the options MLX models support."""


def register(sub: Any) -> None:
    p = sub.add_parser("capture", help="record every module call of one forward pass",
                       description="Record every module call of one forward pass into a trace folder.",
                       epilog=EXAMPLE + "\n\n" + exit_codes_help("captured", "--verify found a difference"),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", metavar="SPEC", help="package.module:function or path/to/script.py:function")
    p.add_argument("--out", required=True, metavar="DIR", help="trace folder (must be empty unless --overwrite)")
    p.add_argument("--inputs", metavar="FILE", help="safetensors file replacing the example inputs "
                   "(keys args.0, kwargs.NAME)")
    p.add_argument("--inputs-map", action="append", metavar="FILE_KEY=SLOT",
                   help="which key of the --inputs file feeds which input of the model, e.g. "
                        "'args.0=kwargs.input_ids' (repeatable); without it, the only tensor of each side is paired "
                        "when shape and dtype agree")
    p.add_argument("--save-inputs", metavar="FILE", help="also write the inputs used to FILE")
    p.add_argument("--tensors", choices=["full", "summary", "repr"], default="full",
                   help="full payloads (default), statistics only, or repr lines")
    p.add_argument("--prune-layers", action="store_true", help="keep only the first and last layer blocks")
    p.add_argument("--backward", action="store_true",
                   help="run with autograd, then backward from the output's loss (or the sum of its first "
                        "tensor), recording each module's gradients too")
    p.add_argument("--ranks", choices=["0", "all"], default="0",
                   help="under torchrun: only rank 0 records (default), or every rank writes DIR/rank{r} with the "
                        "layout of each tensor (a multi-rank folder: align reads it as one global trace)")
    p.add_argument("--overwrite", action="store_true", help="replace a trace already in DIR")
    p.add_argument("--verify", action="store_true",
                   help="also run without capture and check the outputs are bit-identical (exit 1 if not)")
    p.add_argument("--generate", action="store_true",
                   help="run model.generate(**inputs) instead of one forward; each forward pass is recorded as a "
                        "decode step (0: the prefill, k: the pass reading the k-th new token)")
    p.add_argument("--max-new-tokens", type=int, metavar="N", help="with --generate: tokens to generate")
    p.add_argument("--steps", metavar="LIST",
                   help="with --generate: the decode steps whose tensors are written in full, e.g. 0,1,-1 (negative: "
                        "from the last); the others keep statistics only (default: every step in full)")
    p.add_argument("--other-steps", choices=("stats", "tree"), default="stats",
                   help="with --steps: what the steps left out keep: stats (default: each tensor's statistics) or "
                        "tree (the call tree, shapes, dtypes and tokens only; costs least)")
    p.add_argument("--teacher-forcing", metavar="REF_TRACE",
                   help="with --generate: feed the tokens the reference trace generated, step by step, instead of "
                        "the model's own choice (its greedy choice is recorded; align reports where it differs); "
                        "the reference must come from the same prompt and vocabulary")
    p.add_argument("--compiled", choices=("modules", "regions"), default="modules",
                   help="a model under torch.compile: record every module inside the compiled graph (modules, "
                        "default; each compiled region compiles once more), or only the calls of the regions "
                        "compiled inside the model, from outside, running the code compiled before (regions); see "
                        "docs/compiled.md")
    add_ops_options(p)
    p.add_argument("--dtype", metavar="DTYPE",
                   help="cast the model and its floating inputs first (bfloat16, float16, float32, float64): "
                        "how a baseline for align --baseline is captured")
    p.add_argument("--device", metavar="DEVICE", help="move the model and its inputs first (cpu, cuda, cuda:1)")
    p.add_argument("--writers", type=int, metavar="N",
                   help="threads writing payload files while the forward runs (default: 2 with CUDA or idle "
                        "cores, else 0: written in the hook)")
    p.add_argument("--pool-mb", type=int, default=256, metavar="MB",
                   help="host memory for payloads waiting to be written (default 256; the forward waits when full)")
    runtime_flags = _add_runtime_options(p)
    # what each option is when not given, read from the parser itself: an option of the other kind of SPEC is
    # refused only when given
    p.set_defaults(run=run, runtime_flags=runtime_flags,
                   option_defaults={dest: p.get_default(dest) for dest in (*_SPEC_ONLY, *runtime_flags)})


def _add_runtime_options(p: argparse.ArgumentParser) -> dict[str, str]:
    """One option group per runtime whose models are files, from the options its adapter declares
    (:class:`tracediff.capturing.adapters.RuntimeOption`); dest -> flag of every option added."""
    from ...capturing.adapters import file_adapters

    flags: dict[str, str] = {}
    for adapter in file_adapters():
        if not adapter.options:
            continue
        group = p.add_argument_group(adapter.file_kind or f"a {adapter.models} model file")
        for option in adapter.options:
            if option.name in flags or option.name in _SPEC_ONLY:  # one flag per name
                continue
            kind: dict[str, Any] = {"type": int} if option.kind == "int" else {}
            group.add_argument(option.flag, dest=option.name, choices=option.choices, metavar=option.metavar,
                               help=option.help, **kind)
            flags[option.name] = option.flag
    return flags


def run(args: argparse.Namespace) -> int:
    from ...capturing.inputs_map import parse_inputs_map
    from ...capturing.model_file import is_model_file
    from ...capturing.spec import capture_spec
    from ...errors import UsageError

    if is_model_file(args.spec):
        return _run_model_file(args)
    given = _given(args, args.runtime_flags)
    if given:
        raise UsageError(f"{args.spec}: {', '.join(given)} {'is' if len(given) == 1 else 'are'} for a model file "
                         "(tracediff capture model.gguf); a SPEC runs in PyTorch")

    try:
        session = capture_spec(args.spec, args.out, inputs=args.inputs, save_inputs_to=args.save_inputs,
                               tensors=args.tensors, overwrite=args.overwrite, verify=args.verify,
                               prune_layers=args.prune_layers, backward=args.backward, progress=True,
                               dtype=args.dtype, device=args.device, inputs_map=parse_inputs_map(args.inputs_map),
                               on_note=lambda note: print(f"tracediff capture: {note}"), writers=args.writers,
                               pool_mb=args.pool_mb, generate=args.generate, max_new_tokens=args.max_new_tokens,
                               steps=args.steps, teacher_forcing=args.teacher_forcing, other_steps=args.other_steps,
                               ranks="all" if args.ranks == "all" else 0, compiled=args.compiled,
                               **ops_kwargs(args))
    except BaseException:
        _release_process_group(wait=False)
        raise
    _release_process_group(wait=True)
    size = session.payload_bytes / 1e6
    ops = f" and {session.ops} ops" if session.ops else ""
    steps = session.metadata.get("options", {}).get("steps")
    recorded = f" in {steps['recorded']} decode steps ({len(steps['full'])} in full)" if steps else ""
    forced = session.metadata.get("options", {}).get("teacher_forcing")
    recorded += f", fed the {forced['steps']} tokens of {forced['reference']}" if forced else ""
    print(f"captured {session.calls} module calls{ops}{recorded} into {session.trace_dir} "
          f"({session.files} payload files, {size:.1f} MB)")
    if session.verification is not None:
        v = session.verification
        if v:
            print(f"verified: {v.compared} outputs bit-identical to a run without capture")
        else:
            print(f"verification failed: {'; '.join(v.differences)}", file=sys.stderr)
            return 1
    return 0


def _run_model_file(args: argparse.Namespace) -> int:
    """``tracediff capture model.gguf --inputs FILE --out DIR``: a model that is a file, run on the file's inputs."""
    from ...capturing.model_file import capture_file
    from ...errors import UsageError

    if args.compiled != "modules":
        raise UsageError(f"{args.spec}: --compiled {args.compiled} is for torch models under torch.compile; a model "
                         "file runs in its own runtime")
    given = _given(args, _SPEC_ONLY)
    if given:
        raise UsageError(f"{args.spec}: {', '.join(given)} {'is' if len(given) == 1 else 'are'} for a SPEC run in "
                         "PyTorch; a model file runs in its own runtime on --inputs")
    if args.inputs is None:
        raise UsageError(f"{args.spec}: a model file needs --inputs FILE (the token ids, e.g. written by the "
                         "reference side's --save-inputs)")
    options = _runtime_options(args)
    session = capture_file(args.spec, args.out, inputs=args.inputs, tensors=args.tensors, overwrite=args.overwrite,
                           options=options)
    print(f"captured {session.calls} graph nodes into {session.trace_dir} ({session.files} payload files, "
          f"{session.payload_bytes / 1e6:.1f} MB)")
    return 0


# dest -> flag: the options that only one kind of SPEC takes; given to the other, they are refused
_SPEC_ONLY = {
    "inputs_map": "--inputs-map", "save_inputs": "--save-inputs", "prune_layers": "--prune-layers",
    "backward": "--backward", "ranks": "--ranks", "verify": "--verify", "generate": "--generate",
    "max_new_tokens": "--max-new-tokens", "steps": "--steps", "other_steps": "--other-steps",
    "teacher_forcing": "--teacher-forcing", "dtype": "--dtype", "device": "--device", "writers": "--writers",
    "pool_mb": "--pool-mb", "ops": "--ops", "ops_include": "--ops-include", "ops_exclude": "--ops-exclude",
    "ops_in": "--ops-in", "ops_min_numel": "--ops-min-numel"}


def _runtime_options(args: argparse.Namespace) -> dict[str, Any]:
    """The runtime options given, as load options of the adapter that opens ``args.spec``; an option another
    runtime declares is refused, naming whose it is."""
    from pathlib import Path

    from ...capturing.adapters import adapter_for_path, file_adapters
    from ...errors import UsageError

    adapter = adapter_for_path(Path(args.spec))
    own = {option.name for option in adapter.options} if adapter is not None else set()
    options: dict[str, Any] = {}
    for dest, flag in args.runtime_flags.items():
        value = getattr(args, dest)
        if value == args.option_defaults[dest]:
            continue
        if dest not in own:
            whose = next((other.file_kind or other.models for other in file_adapters()
                          if any(option.name == dest for option in other.options)), "another runtime")
            raise UsageError(f"{args.spec}: {flag} is for {whose}, not for this file")
        options[dest] = value
    return options


def _given(args: argparse.Namespace, options: Mapping[str, str]) -> list[str]:
    return [flag for dest, flag in options.items() if getattr(args, dest) != args.option_defaults[dest]]


def _release_process_group(wait: bool) -> None:
    """Tear down a process group the SPEC started (under torchrun) before this process exits: left to interpreter
    shutdown, gloo's threads are sometimes still joinable and the rank aborts (SIGABRT) after writing a complete
    trace. ``wait``: first let every rank finish writing."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    if not wait:
        with contextlib.suppress(Exception):  # the capture already failed: its error is the one to report
            dist.destroy_process_group()
        return
    dist.barrier()
    dist.destroy_process_group()
