"""Cost of capturing an MLX forward pass, as a ratio to the plain MLX forward measured in the same run.

    python bench/bench_mlx_capture.py [--repeats 7] [--json out.json]

Model: mlx-lm's own Llama (``mlx_lm.models.llama.Model``) with ``hidden_size=128, intermediate_size=384,
num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000``, random weights
(seed 0), float32, batch 1, sequence 64, on mlx's default device (the CPU on Linux). Smaller than the
model of bench/bench_capture.py: mlx 0.32.4's CPU matmul on this project's 2-core x86 machine runs at
well under 1 GFLOP/s (a 256x512 by 512x1536 product takes 0.5 s), so that model's forward takes 20 s
there. Needs the mlx extra.

Configurations, run interleaved in this one process: one warm-up run each, then ``--repeats`` rounds
that run every configuration once, in an order rotated from round to round so that drift of a noisy
machine spreads evenly:

- ``plain``: ``mx.eval(model(tokens))``;
- ``plain_eval_each``: the forward with every module's output evaluated as it returns (what capture
  forces on MLX's lazy graph, without recording anything): how much of the cost is the evaluation;
- ``full``: ``tracediff.capture(model, out)`` around the forward (payloads and statistics);
- ``summary``: the same with ``tensors="summary"`` (statistics only).

Each capture writes into a fresh folder under ``--out-root`` (default: the system temp dir), deleted
after it is measured; its time covers the whole ``with`` block (the JSON trees written on exit
included). Medians are printed with the ratio to ``plain``. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from rotated import rotated_medians  # noqa: E402  (bench/, the script's own folder)


def build() -> tuple[Any, Any]:
    import mlx.core as mx
    from mlx_lm.models import llama

    mx.random.seed(0)
    args = llama.ModelArgs(model_type="llama", hidden_size=128, num_hidden_layers=4, intermediate_size=384,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=1000,
                           tie_word_embeddings=False)
    model = llama.Model(args)
    mx.eval(model.parameters())
    tokens = mx.random.randint(0, 1000, (1, 64), key=mx.random.key(1))
    return model, tokens


def configurations(model: Any, tokens: Any, out_root: Path) -> dict[str, Callable[[], None]]:
    import mlx.core as mx
    import mlx.nn as nn

    import tracediff

    def plain() -> None:
        mx.eval(model(tokens))

    def plain_eval_each() -> None:
        classes = {type(m) for _, m in model.named_modules()}
        saved = {cls: cls.__dict__.get("__call__") for cls in classes}

        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
                out = original(self, *args, **kwargs)
                mx.eval(out)
                return out
            return call

        for cls in classes:
            cls.__call__ = wrap(next(c.__dict__["__call__"] for c in cls.__mro__ if "__call__" in c.__dict__))
        try:
            mx.eval(model(tokens))
        finally:
            for cls, original in saved.items():
                if original is None:
                    del cls.__call__
                else:
                    cls.__call__ = original

    def captured(tensors: str) -> Callable[[], None]:
        def run() -> None:
            out = Path(tempfile.mkdtemp(dir=out_root)) / "trace"
            try:
                with tracediff.capture(model, out, tensors=tensors):  # type: ignore[arg-type]
                    mx.eval(model(tokens))
            finally:
                shutil.rmtree(out.parent)
        return run

    return {"plain": plain, "plain_eval_each": plain_eval_each, "full": captured("full"),
            "summary": captured("summary")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out-root", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import mlx.core as mx

    model, tokens = build()
    runs = configurations(model, tokens, args.out_root)
    names = list(runs)
    medians, times, load = rotated_medians(runs, args.repeats)
    print(f"mlx {mx.__version__} on {mx.default_device()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {load:.1f} before the timing, {args.repeats} rounds")
    print(f"{'config':16} {'median s':>9} {'x plain':>8}")
    for name in names:
        print(f"{name:16} {medians[name]:9.3f} {medians[name] / medians['plain']:7.2f}x")
    if args.json is not None:
        args.json.write_text(json.dumps({"medians": medians, "times": times, "load": load,
                                         "mlx": mx.__version__}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
