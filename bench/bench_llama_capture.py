"""Cost of capturing a llama.cpp decode, as a ratio to the plain decode measured in the same run.

    python bench/bench_llama_capture.py [--repeats 9] [--tokens 64] [--json out.json]

Model: a transformers Llama (hidden 256, intermediate 768, 4 layers, 8 heads, 4 key/value heads, vocabulary 300),
random weights (seed 0), converted by llama.cpp's own ``convert_hf_to_gguf.py`` to an F32 GGUF
(tests/ports/llama_cpp_fixtures.py: the converter of the installed llama-cpp-python's sdist, fetched once),
run by llama-cpp-python on the CPU with an F32 KV cache, flash attention auto, llama.cpp's default threads.
Needs the llama extra.

Configurations, run interleaved in this one process: one warm-up run each, then ``--repeats`` rounds that
run every configuration once, in an order rotated from round to round so that drift of a noisy machine
spreads evenly:

- ``plain``: ``llm.reset(); llm.eval(tokens)``: one decode of the prompt;
- ``plain_fresh_context``: the same decode in a context created for it (what a capture does: llama.cpp's
  eval callback is set when a context is created), recording nothing: how much of the cost is the context;
- ``full``: ``tracediff.capture(llm, out)`` around the decode (every node's payload and statistics);
- ``summary``: the same with ``tensors="summary"`` (statistics only).

Each capture writes into a fresh folder under ``--out-root`` (default: the system temp dir), deleted after
it is measured; its time covers the whole ``with`` block. Medians are printed with the ratio to ``plain``.
Nothing here asserts.
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

SETTINGS = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=4, head_dim=32)


def build(cache: Path) -> Path:
    """The bench model's F32 GGUF, made once into ``cache``."""
    from tests.ports.llama_cpp_fixtures import checkpoint, convert, reference_model, train_tokenizer

    tokenizer = train_tokenizer(cache / "tokenizer")
    folder = checkpoint(reference_model("LlamaConfig", "LlamaForCausalLM", SETTINGS), cache / "hf", tokenizer)
    return convert(folder, cache / "bench-f32.gguf")


def configurations(gguf: Path, tokens: list[int], out_root: Path) -> dict[str, Callable[[], None]]:
    import llama_cpp
    from llama_cpp import _internals

    import tracediff

    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=max(128, 2 * len(tokens)), logits_all=True, verbose=False,
                          type_k=0, type_v=0)
    llm.context_params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO

    def plain() -> None:
        llm.reset()
        llm.eval(tokens)

    def plain_fresh_context() -> None:
        own = llm._ctx
        context = _internals.LlamaContext(model=llm._model, params=llm.context_params, verbose=False)
        llm._ctx = context
        try:
            llm.reset()
            llm.eval(tokens)
        finally:
            llm._ctx = own
            context.close()

    def captured(tensors: str) -> Callable[[], None]:
        def run() -> None:
            out = Path(tempfile.mkdtemp(dir=out_root)) / "trace"
            try:
                with tracediff.capture(llm, out, tensors=tensors):  # type: ignore[arg-type]
                    llm.eval(tokens)
            finally:
                shutil.rmtree(out.parent)
        return run

    return {"plain": plain, "plain_fresh_context": plain_fresh_context, "full": captured("full"),
            "summary": captured("summary")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "tracediff-bench-llama")
    parser.add_argument("--out-root", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import llama_cpp

    gguf = build(args.cache)
    tokens = [3 + (7 * i) % 97 for i in range(args.tokens)]
    runs = configurations(gguf, tokens, args.out_root)
    names = list(runs)
    medians, times, load = rotated_medians(runs, args.repeats)
    print(f"llama-cpp-python {llama_cpp.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {load:.1f} before the timing, {args.repeats} rounds, "
          f"{len(tokens)} tokens")
    print(f"{'config':20} {'median s':>9} {'x plain':>8}")
    for name in names:
        print(f"{name:20} {medians[name]:9.4f} {medians[name] / medians['plain']:7.2f}x")
    if args.json is not None:
        record: dict[str, Any] = {"medians": medians, "times": times, "load": load,
                                  "llama_cpp_python": llama_cpp.__version__}
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
