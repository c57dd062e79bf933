"""Cost of ``tracediff.replay`` on the capture benchmark's Llama, as a multiple of one plain forward.

    python bench/bench_replay.py [--repeats 1] [--layers 8] [--seq-len 256] [--port fp32|bf16] [--json out.json]

Model: the one of ``bench/bench_capture.py`` (``LlamaForCausalLM``, hidden size
512, 8 layers, vocabulary 8000, random weights, seed 0, sdpa attention),
batch 1, sequence 256, CPU. A's full trace (``tracediff.capture(tensors="full")``,
float32) is written once to a temporary folder. B is the same model
(``--port fp32``: a clean port) or a bfloat16 copy of it (``--port bf16``).
Then, interleaved over ``--repeats`` rounds: one plain forward of B under
``torch.no_grad()``; ``tracediff.replay`` of every module call of B on A's
trace without the oracle (``oracle=False``); with it (the default: float64
runs only for calls out of tolerance); and with it and ``atol=0, rtol=0``
(float64 runs for every call that is not bit-identical). Times are CPU
times of the process (``time.process_time``, all threads), on ``--threads``
torch threads (default 1), which a machine shared with other jobs inflates
far less than wall time; medians are reported, with the ratio to the plain
forward and how many calls ran in float64. Nothing here asserts.
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_capture  # noqa: E402

import tracediff  # noqa: E402


def _timed(run: Any) -> tuple[float, Any]:
    """CPU time of the process (all threads) for ``run()``: far less inflated than wall time on a busy machine."""
    started = time.process_time()
    value = run()
    return time.process_time() - started, value


CONFIGS = {
    "no_oracle": ("replay, oracle=False", {"oracle": False}),
    "oracle": ("replay, float64 oracle (default)", {}),
    "oracle_all": ("replay, float64 oracle, atol=0 rtol=0", {"atol": 0.0, "rtol": 0.0}),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--port", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    model, input_ids = bench_capture.build_model(args.layers, args.seq_len)
    root = Path(tempfile.mkdtemp(prefix="tracediff-bench-replay-"))
    times: dict[str, list[float]] = {"plain": [], **{name: [] for name in CONFIGS}}
    results: dict[str, Any] = {}
    try:
        with torch.no_grad(), tracediff.capture(model, root / "a"):
            model(input_ids=input_ids)
        if args.port == "bf16":
            model = model.to(torch.bfloat16)
        with torch.no_grad():
            model(input_ids=input_ids)  # warm-up
        for _ in range(args.repeats):
            with torch.no_grad():
                times["plain"].append(_timed(lambda: model(input_ids=input_ids))[0])
            for name, (_, options) in CONFIGS.items():
                seconds, results[name] = _timed(lambda options=options: tracediff.replay(model, root / "a", **options))
                times[name].append(seconds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(times["plain"])
    figures: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "load_average": os.getloadavg(), "torch": torch.__version__},
        "model": {"layers": args.layers, "seq_len": args.seq_len, "port": args.port},
        "plain_forward_s": base,
    }
    print(f"machine: {figures['machine']}")
    print(f"B: {args.port} port, {args.layers} layers, sequence {args.seq_len}")
    print(f"{'plain forward':42s} {base * 1e3:10.1f} ms   1.0x")
    for name, (label, _) in CONFIGS.items():
        result = results[name]
        median = statistics.median(times[name])
        in_float64 = sum(1 for c in result.modules if any(t.factor is not None for t in c.tensors))
        figures[name] = {"seconds": median, "x_plain": median / base, "calls": len(result.modules),
                         "calls_in_float64": in_float64, "culprits": [c.module_path_b for c in result.culprits]}
        print(f"{label:42s} {median * 1e3:10.1f} ms {median / base:5.1f}x   {len(result.modules)} calls, "
              f"{in_float64} in float64, {len(result.culprits)} culprit(s)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
