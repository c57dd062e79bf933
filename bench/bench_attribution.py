"""Cost of ``tracediff.attribute`` against the one-at-a-time scan it replaces, side by side in one run.

    python bench/bench_attribution.py [--repeats 3] [--layers 8] [--hidden 512] [--seq-len 256] [--quant int4wo]
                                      [--modules layers]

Model: a ``LlamaForCausalLM`` (``tests/attribution/models.py``'s, scaled up:
hidden size ``--hidden``, ``--layers`` layers, vocabulary 256, random weights,
seed 0, eager attention), batch 1, sequence ``--seq-len``, CPU, one torch
thread. A's full trace is captured once (its cost is printed, not counted:
the scan needs the float model's own output too). B is the float model with
every decoder layer's Linears quantized by torchao (``--quant``). Interleaved
over ``--repeats`` rounds: ``tracediff.attribute(B, A's trace, modules=...)``
(``--modules``: layers or leaves), and ``sensitivity_scan`` over the same
calls (a fresh float copy per call, that call's Linears quantized, one
forward each, plus the float model's forward). Times are
CPU times of the process (``time.process_time``); medians are reported with the
forward passes each needs. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tracediff  # noqa: E402
from tests.attribution import models  # noqa: E402
from tracediff.attribution import attribute, sensitivity_scan  # noqa: E402


def build(layers: int, hidden: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=models.VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=1024, use_cache=False, attn_implementation="eager")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--quant", default="int4wo", choices=["int4wo", "int8wo", "int8dyn"])
    parser.add_argument("--modules", default="layers", choices=["layers", "leaves"])
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    float_model = build(args.layers, args.hidden)
    kwargs = {"input_ids": torch.randint(0, models.VOCAB, (1, args.seq_len),
                                         generator=torch.Generator().manual_seed(1))}
    quantize = models.torchao(args.quant)
    b = copy.deepcopy(float_model)
    quantize(b, "model.layers")
    tmp = Path(tempfile.mkdtemp(prefix="bench-attribution-"))
    try:
        started = time.process_time()
        with tracediff.capture(float_model, tmp / "float"):
            float_model(**kwargs)
        capture_s = time.process_time() - started
        with torch.no_grad():
            b(**kwargs)  # the first call may pack or warm kernels up
            started = time.process_time()
            b(**kwargs)
            forward_s = time.process_time() - started
            started = time.process_time()
            float_model(**kwargs)
            float_s = time.process_time() - started
        attribution, scan, forwards = [], [], ("", "")
        for _ in range(args.repeats):
            started = time.process_time()
            result = attribute(b, tmp / "float", modules=args.modules)
            attribution.append(time.process_time() - started)
            paths = [c.module_path.split(".", 1)[1] for c in result.ranking]
            started = time.process_time()
            scanned = sensitivity_scan(float_model, quantize, paths, kwargs)
            scan.append(time.process_time() - started)
            forwards = (f"{result.forward_passes} (from each call on) + {result.module_runs} single-module runs",
                        f"{scanned.forward_passes} + {scanned.forward_passes - 1} quantizations")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"Llama hidden {args.hidden}, {args.layers} layers, sequence {args.seq_len}, torchao {args.quant}, "
          f"CPU time, 1 thread, median of {args.repeats}")
    print(f"capture of A (once, not counted): {capture_s:.2f} s; one forward of B: {forward_s:.3f} s, of the float "
          f"model: {float_s:.3f} s")
    print("| | forward passes of the model | CPU time (median) | x one forward of B |")
    print("|---|---|---|---|")
    for name, count, times in ((f"tracediff.attribute ({args.modules})", forwards[0], attribution),
                               ("one-at-a-time scan", forwards[1], scan)):
        median = statistics.median(times)
        print(f"| {name} | {count} | {median:.2f} s | {median / forward_s:.1f}x |")
    print(f"attribution / scan: {statistics.median(attribution) / statistics.median(scan):.2f}")


if __name__ == "__main__":
    main()
