"""Cost of op-level capture, as a multiple of a plain forward.

    python bench/bench_ops.py [--repeats 3] [--layers 8] [--seq-len 256] [--json out.json]

Model: the Llama of ``bench/bench_capture.py`` (its ``cpu`` preset: hidden
size 512, 8 layers, 8 heads, 4 key/value heads, vocabulary 8000), random
weights (seed 0), batch 1, CPU, float32, under ``torch.no_grad()``.

Configurations: a plain forward; ``tracediff.capture`` with ``tensors="full"``
and ``"summary"``, each without ops, with ``ops_in`` limited to one layer
(the middle layer, ``model.layers.{layers // 2}``: its attention, MLP,
norms and their ops), and with ops
in the whole model. Every configuration runs in this one process: one
warm-up run each, then ``--repeats`` rounds that run every configuration once,
in an order rotated from round to round; the median wall time and the median CPU time of the process (all its threads:
less distorted than wall time when other jobs share the cores) are reported. Each capture
writes into a fresh temporary folder, deleted after it is measured; its time
covers the whole ``with`` block (JSON written on exit included). Nothing here
asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_capture import build_model  # noqa: E402 - the same Llama as the capture benchmark

LAYER = "model.layers.{layer}"  # the middle layer; --layers sets the count
CONFIGS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "plain": ("plain forward", None),
    "full": ('tensors="full"', {"tensors": "full"}),
    "full_ops_layer": (f'tensors="full", ops_in="{LAYER}"', {"tensors": "full", "ops_in": LAYER}),
    "full_ops": ('tensors="full", ops=True', {"tensors": "full", "ops": True}),
    "summary": ('tensors="summary"', {"tensors": "summary"}),
    "summary_ops_layer": (f'tensors="summary", ops_in="{LAYER}"', {"tensors": "summary", "ops_in": LAYER}),
    "summary_ops": ('tensors="summary", ops=True', {"tensors": "summary", "ops": True}),
}


def run_once(options: dict[str, Any] | None, model: torch.nn.Module, input_ids: torch.Tensor,
             root: Path) -> dict[str, Any]:
    import tracediff

    if options is None:
        start, cpu = time.perf_counter(), time.process_time()
        model(input_ids)
        return {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu}
    out = Path(tempfile.mkdtemp(prefix="tracediff-bench-ops-", dir=root))
    try:
        start, cpu = time.perf_counter(), time.process_time()
        with tracediff.capture(model, out, overwrite=True, **options) as session:
            model(input_ids)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
        return {"seconds": seconds, "cpu_seconds": cpu_seconds, "ops": session.ops, "calls": session.calls,
                "files": session.files, "payload_mb": session.payload_bytes / 1e6}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up (default 3)")
    parser.add_argument("--layers", type=int, default=8, help="num_hidden_layers (default 8)")
    parser.add_argument("--seq-len", type=int, default=256, help="sequence length (default 256)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="subset of: " + ", ".join(CONFIGS))
    parser.add_argument("--out-root", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", type=Path, help="also write every measurement to this JSON file")
    args = parser.parse_args(argv)
    names = [n for n in args.configs.split(",") if n]
    for name, (label, options) in CONFIGS.items():
        if options and "ops_in" in options:
            options["ops_in"] = options["ops_in"].format(layer=args.layers // 2)
            CONFIGS[name] = (label.format(layer=args.layers // 2), options)
    model, input_ids = build_model(args.layers, args.seq_len)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    with torch.no_grad():
        for name in names:  # warm-up
            run_once(CONFIGS[name][1], model, input_ids, args.out_root)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                runs[name].append(run_once(CONFIGS[name][1], model, input_ids, args.out_root))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    plain = statistics.median(m["seconds"] for m in runs["plain"]) if "plain" in runs else None
    plain_cpu = statistics.median(m["cpu_seconds"] for m in runs["plain"]) if "plain" in runs else None
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, threads {torch.get_num_threads()}, "
          f"load average {load:.2f}; Llama {args.layers} layers, seq {args.seq_len}; median of {args.repeats}")
    print(f"{'configuration':44} {'wall s':>8} {'x plain':>8} {'CPU s':>8} {'x plain':>8} {'ops':>5} {'files':>6} "
          f"{'MB':>7}")
    for name in names:
        median = statistics.median(m["seconds"] for m in runs[name])
        cpu = statistics.median(m["cpu_seconds"] for m in runs[name])
        last = runs[name][-1]
        ratio = f"{median / plain:.2f}" if plain else ""
        cpu_ratio = f"{cpu / plain_cpu:.2f}" if plain_cpu else ""
        print(f"{CONFIGS[name][0]:44} {median:8.3f} {ratio:>8} {cpu:8.3f} {cpu_ratio:>8} {last.get('ops', ''):>5} "
              f"{last.get('files', ''):>6} {last.get('payload_mb', 0):7.1f}")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "load_average": load}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
