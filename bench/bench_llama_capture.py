"""Cost of capturing a llama.cpp decode, as a ratio to the plain decode measured in the same run.

    python bench/bench_llama_capture.py [--size small|large] [--repeats 9] [--tokens 64] [--json out.json]

Model (``--size small``, the default): a transformers Llama (hidden 256, intermediate 768, 4 layers, 8 heads,
4 key/value heads, vocabulary 300), 13 MB; ``--size large``: hidden 1024, intermediate 2816, 8 layers, 16 heads,
8 key/value heads (101 M parameters, 406 MB), a decode of 128 tokens in hundreds of milliseconds, where
llama.cpp's own work dominates. Random weights (seed 0), converted by llama.cpp's own ``convert_hf_to_gguf.py``
to an F32 GGUF (tests/ports/llama_cpp_fixtures.py: the converter of the installed llama-cpp-python's sdist,
fetched once), run by llama-cpp-python on the CPU with an F32 KV cache, flash attention auto, llama.cpp's
default threads. Needs the llama extra.

Configurations, run interleaved in this one process: one warm-up run each, then ``--repeats`` rounds that
run every configuration once, in an order rotated from round to round so that drift of a noisy machine
spreads evenly:

- ``plain``: ``llm.reset(); llm.eval(tokens)``: one decode of the prompt;
- ``plain_fresh_context``: the same decode in a context created for it (what a capture does: llama.cpp's
  eval callback is set when a context is created), recording nothing: how much of the cost is the context;
- ``callback_only``: the same in a context whose eval callback asks for every node and reads none (returns
  at once, in Python through ctypes as a capture's does): ggml then computes the graph node by node, a node
  per graph compute; what no capture through llama.cpp's eval callback can beat;
- ``full``: ``tracediff.capture(llm, out)`` around the decode (every node's payload and statistics);
- ``summary``: the same with ``tensors="summary"`` (statistics only);
- ``write_floor``: writing the bytes a full capture writes, as payload files of the same sizes, to a fresh
  folder: with ``plain``, what no full capture can beat.

The per-node cost is ``(full - plain_fresh_context - write_floor) / nodes`` (and the same for ``summary``
without the write): what the capture adds per graph node beyond running the graph and writing its bytes.

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
from rotated import payload_sizes, rotated_medians, write_floor  # noqa: E402  (bench/, the script's own folder)

SIZES = {
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=32),
    "large": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=64),
}


def build(cache: Path, size: str) -> Path:
    """The bench model's F32 GGUF, made once into ``cache``."""
    from tests.ports.llama_cpp_fixtures import checkpoint, convert, reference_model, train_tokenizer

    tokenizer = train_tokenizer(cache / "tokenizer")
    model = reference_model("LlamaConfig", "LlamaForCausalLM", SIZES[size])
    folder = checkpoint(model, cache / f"hf-{size}", tokenizer)
    return convert(folder, cache / f"bench-{size}-f32.gguf")


def written(gguf: Path, tokens: list[int], out_root: Path) -> tuple[list[int], int]:
    """The payload sizes a full capture writes, and its graph nodes (one capture, untimed)."""
    import llama_cpp

    import tracediff

    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=max(128, 2 * len(tokens)), logits_all=True, verbose=False,
                          type_k=0, type_v=0)
    out = Path(tempfile.mkdtemp(dir=out_root)) / "trace"
    try:
        with tracediff.capture(llm, out) as session:
            llm.eval(tokens)
        sizes = payload_sizes(out)
    finally:
        shutil.rmtree(out.parent)
    llm.close()
    return sizes, session.calls


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

    def decode_in_context(params: Any) -> None:
        """The decode in a context of ``params`` made for it, as a capture makes one."""
        own = llm._ctx
        context = _internals.LlamaContext(model=llm._model, params=params, verbose=False)
        llm._ctx = context
        try:
            llm.reset()
            llm.eval(tokens)
        finally:
            llm._ctx = own
            context.close()

    def plain_fresh_context() -> None:
        decode_in_context(llm.context_params)

    def callback_only() -> None:
        params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
        callback = llama_cpp.ggml_backend_sched_eval_callback(lambda _node, _ask, _data: True)
        params.cb_eval, params.cb_eval_user_data = callback, None
        decode_in_context(params)

    def captured(tensors: str) -> Callable[[], None]:
        def run() -> None:
            out = Path(tempfile.mkdtemp(dir=out_root)) / "trace"
            try:
                with tracediff.capture(llm, out, tensors=tensors):  # type: ignore[arg-type]
                    llm.eval(tokens)
            finally:
                shutil.rmtree(out.parent)
        return run

    return {"plain": plain, "plain_fresh_context": plain_fresh_context, "callback_only": callback_only,
            "full": captured("full"), "summary": captured("summary")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="small")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=None, help="prompt length (default 64 small, 128 large)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "tracediff-bench-llama")
    parser.add_argument("--out-root", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import llama_cpp

    gguf = build(args.cache, args.size)
    count = args.tokens or (128 if args.size == "large" else 64)
    tokens = [3 + (7 * i) % 97 for i in range(count)]
    sizes, nodes = written(gguf, tokens, args.out_root)
    runs = configurations(gguf, tokens, args.out_root)
    runs["write_floor"] = write_floor(sizes, args.out_root)
    names = list(runs)
    medians, times, load = rotated_medians(runs, args.repeats)
    print(f"llama-cpp-python {llama_cpp.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {load:.1f} before the timing, {args.repeats} rounds, "
          f"{len(tokens)} tokens, --size {args.size} ({gguf.stat().st_size / 1e6:.0f} MB GGUF), {nodes} graph "
          f"nodes, {sum(sizes) / 1e6:.0f} MB of payloads")
    print(f"{'config':20} {'median s':>9} {'x plain':>8}")
    for name in names:
        print(f"{name:20} {medians[name]:9.4f} {medians[name] / medians['plain']:7.2f}x")
    floor = medians["plain"] + medians["write_floor"]
    per_full = (medians["full"] - medians["plain_fresh_context"] - medians["write_floor"]) / max(nodes, 1)
    per_summary = (medians["summary"] - medians["plain_fresh_context"]) / max(nodes, 1)
    print(f"the eval callback alone: {medians['callback_only'] / medians['plain']:.2f}x plain, "
          f"{(medians['callback_only'] - medians['plain_fresh_context']) / max(nodes, 1) * 1e6:.0f} us per node")
    print(f"full: {medians['full'] / floor:.2f}x (plain + write floor {floor:.4f} s); summary: "
          f"{medians['summary'] / medians['plain']:.2f}x plain; per node: full {per_full * 1e6:.0f} us, summary "
          f"{per_summary * 1e6:.0f} us")
    if args.json is not None:
        record: dict[str, Any] = {"medians": medians, "times": times, "load": load, "size": args.size,
                                  "nodes": nodes, "payload_bytes": sum(sizes),
                                  "llama_cpp_python": llama_cpp.__version__}
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
