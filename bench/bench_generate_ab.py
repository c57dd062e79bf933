"""Capture of a greedy generation by two versions of tracediff, side by side in one process.

    python bench/bench_generate_ab.py --baseline /tmp/genbench-before [--tokens 256] [--steps 0,-1]
        [--summary] [--tiny] [--repeats 3]

``--baseline`` is a checkout of another version (``git archive <commit> | tar -x -C DIR``): its
``tracediff`` package is copied under another name into a temporary folder and imported beside the one
on ``PYTHONPATH``. Configurations, interleaved (a warm-up each, then ``--repeats`` rounds in rotated
order): ``plain`` (the generation alone), ``baseline`` and ``current`` (the same inside each version's
``capture``, ``steps=...`` or with ``--summary`` ``tensors="summary"``). Medians, ratios to plain, and
the CPU seconds of the capturing thread (less disturbed by other processes than wall time).

Model: the bench model of ``bench_generate.py``; ``--tiny``: the same Llama with hidden size 64 and one
torch thread, whose step costs little next to the capture's work per module call.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import build  # noqa: E402

BASELINE_PACKAGE = "tracediff_baseline"


def import_baseline(checkout: Path, into: Path) -> Any:
    """The ``capture`` of ``checkout``'s package, imported as ``tracediff_baseline`` (its imports are relative)."""
    shutil.copytree(checkout / "tracediff", into / BASELINE_PACKAGE)
    sys.path.insert(0, str(into))
    return importlib.import_module(f"{BASELINE_PACKAGE}.capturing.session").capture


def tiny_model() -> tuple[torch.nn.Module, torch.Tensor]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    config = LlamaConfig(num_hidden_layers=8, hidden_size=64, intermediate_size=192, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=8000, max_position_embeddings=4096, pad_token_id=0,
                         bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    return model, torch.randint(0, 8000, (1, 32), generator=torch.Generator().manual_seed(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the version to compare with")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--steps", default="0,-1")
    parser.add_argument("--summary", action="store_true", help='tensors="summary" instead of steps=...')
    parser.add_argument("--tiny", action="store_true", help="hidden size 64, one torch thread")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from tracediff.capturing.session import capture as current

    work = Path(tempfile.mkdtemp(prefix="tracediff-bench-ab-"))
    try:
        baseline = import_baseline(args.baseline, work)
        model, ids = tiny_model() if args.tiny else build()
        kwargs = {"max_new_tokens": args.tokens, "min_new_tokens": args.tokens, "do_sample": False}
        options: dict[str, Any] = {"tensors": "summary"} if args.summary else {"steps": args.steps}
        captures = {"plain": None, "baseline": baseline, "current": current}

        def run_once(config: str) -> tuple[float, float]:
            out = Path(tempfile.mkdtemp(dir=work)) / "trace"
            start, cpu = time.perf_counter(), time.thread_time()
            with torch.no_grad():
                if captures[config] is None:
                    model.generate(ids, **kwargs)
                else:
                    with captures[config](model, out, **options):
                        model.generate(ids, **kwargs)
            seconds = (time.perf_counter() - start, time.thread_time() - cpu)
            shutil.rmtree(out.parent)
            return seconds

        configs = list(captures)
        for config in configs:  # warm-up
            run_once(config)
        runs: dict[str, list[tuple[float, float]]] = {c: [] for c in configs}
        for round_ in range(args.repeats):
            for config in configs[round_ % 3:] + configs[:round_ % 3]:
                runs[config].append(run_once(config))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    plain = statistics.median(wall for wall, _ in runs["plain"])
    plain_cpu = min(cpu for _, cpu in runs["plain"])
    what = "tensors=summary" if args.summary else f"--steps {args.steps}"
    print(f"{args.tokens}-token greedy generation, {'tiny' if args.tiny else 'bench'} model, {what}, "
          f"{args.repeats} rounds; baseline {args.baseline}")
    print("| config | median s | min-max s | vs plain | thread CPU s (min) | capture CPU per step ms |")
    print("|---|---|---|---|---|---|")
    for config, values in runs.items():
        walls, cpus = [w for w, _ in values], [c for _, c in values]
        median = statistics.median(walls)
        print(f"| {config} | {median:.2f} | {min(walls):.2f}-{max(walls):.2f} | {median / plain:.2f}x | "
              f"{min(cpus):.3f} | {(min(cpus) - plain_cpu) / args.tokens * 1e3:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
