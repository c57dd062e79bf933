"""Cost of ``tracediff.replay`` on the capture benchmark's Llama, as a multiple of one plain forward.

    python bench/bench_replay.py [--repeats 3] [--layers 8] [--seq-len 256] [--json out.json]

Model: the one of ``bench/bench_capture.py`` (``LlamaForCausalLM``, hidden size
512, 8 layers, vocabulary 8000, random weights, seed 0), batch 1, sequence
256, CPU, float32. Its full trace (``tracediff.capture(tensors="full")``) is
written once to a temporary folder; then, interleaved over ``--repeats``
rounds: one plain forward under ``torch.no_grad()``, ``tracediff.replay``
of every module call of the same model on that trace with the float64 oracle,
and without it (``oracle=False``). Medians are reported, with the ratio to the
plain forward. The replayed model is B = A (a clean port), so the figures
include no culprit reruns; ``--patch-bug`` scales one ``down_proj`` so that a
culprit, its explained parents and one ``patch=True`` forward are included.
Nothing here asserts.
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
    started = time.perf_counter()
    value = run()
    return time.perf_counter() - started, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--patch-bug", action="store_true", help="scale layer 1's down_proj and replay with patch=True")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)

    model, input_ids = bench_capture.build_model(args.layers, args.seq_len)
    root = Path(tempfile.mkdtemp(prefix="tracediff-bench-replay-"))
    try:
        with torch.no_grad(), tracediff.capture(model, root / "a"):
            model(input_ids=input_ids)
        if args.patch_bug:
            with torch.no_grad():
                model.model.layers[1].mlp.down_proj.weight.mul_(1.1)
        plain: list[float] = []
        oracle: list[float] = []
        no_oracle: list[float] = []
        result = None
        with torch.no_grad():
            model(input_ids=input_ids)  # warm-up
        for _ in range(args.repeats):
            with torch.no_grad():
                plain.append(_timed(lambda: model(input_ids=input_ids))[0])
            seconds, result = _timed(lambda: tracediff.replay(model, root / "a", patch=args.patch_bug))
            oracle.append(seconds)
            no_oracle.append(_timed(lambda: tracediff.replay(model, root / "a", oracle=False,
                                                              patch=args.patch_bug))[0])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(plain)
    figures = {
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "load_average": os.getloadavg(), "torch": torch.__version__},
        "model": {"layers": args.layers, "seq_len": args.seq_len, "patch_bug": args.patch_bug},
        "calls_replayed": len(result.modules) if result else 0,
        "culprits": [c.module_path_b for c in result.culprits] if result else [],
        "plain_forward_s": base,
        "replay_oracle_s": statistics.median(oracle),
        "replay_no_oracle_s": statistics.median(no_oracle),
        "replay_oracle_x": statistics.median(oracle) / base,
        "replay_no_oracle_x": statistics.median(no_oracle) / base,
    }
    print(f"machine: {figures['machine']}")
    print(f"replayed {figures['calls_replayed']} module calls; culprits: {figures['culprits'] or 'none'}")
    print(f"plain forward            {base * 1e3:9.1f} ms   1.00x")
    print(f"replay, float64 oracle   {figures['replay_oracle_s'] * 1e3:9.1f} ms  {figures['replay_oracle_x']:5.1f}x")
    print(f"replay, --no-oracle      {figures['replay_no_oracle_s'] * 1e3:9.1f} ms  "
          f"{figures['replay_no_oracle_x']:5.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
