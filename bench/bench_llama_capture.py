"""Cost of capturing a llama.cpp decode, as a ratio to the plain decode measured in the same run.

    python bench/bench_llama_capture.py [--size small|large|1b] [--repeats 9] [--tokens 64] [--json out.json]

Model (``--size small``, the default): a transformers Llama (hidden 256, intermediate 768, 4 layers, 8 heads,
4 key/value heads, vocabulary 300), 13 MB; ``--size large``: hidden 1024, intermediate 2816, 8 layers, 16 heads,
8 key/value heads (101 M parameters, 406 MB), a decode of 128 tokens in hundreds of milliseconds, where
llama.cpp's own work dominates. Random weights (seed 0), converted by llama.cpp's own ``convert_hf_to_gguf.py``
to an F32 GGUF (tests/ports/llama_cpp_fixtures.py: the converter of the installed llama-cpp-python's sdist,
fetched once), run by llama-cpp-python on the CPU with an F32 KV cache, flash attention auto, llama.cpp's
default threads. ``--size 1b`` is what users run, at every default: the shape of Llama 3.2 1B (hidden 2048,
intermediate 8192, 16 layers, 32 heads, 8 key/value heads; its vocabulary aside, 0.97 B parameters) saved
in bfloat16 as its published checkpoint is, converted at the converter's default ``--outtype auto`` (a BF16
GGUF, 1.9 GB) and run with llama.cpp's default F16 KV cache, a decode of 64 tokens by default. Needs the
llama extra; the first run builds the model (about a minute here, 4 GB in ``--cache``).

Configurations, run interleaved in this one process: one warm-up run each, then ``--repeats`` rounds that
run every configuration once, in an order rotated from round to round so that drift of a noisy machine
spreads evenly (the two diagnoses, ``callback_statistics_and_wait`` and ``summary_without_journal``, only
when named in ``--configs``):

- ``plain``: ``llm.reset(); llm.eval(tokens)``: one decode of the prompt;
- ``plain_fresh_context``: the same decode in a context created for it (what a capture does: llama.cpp's
  eval callback is set when a context is created), recording nothing: how much of the cost is the context;
- ``callback_only``: the same in a context whose eval callback asks for every node and reads none (returns
  at once, in Python through ctypes as a capture's does): ggml then computes the graph node by node, a node
  per graph compute;
- ``callback_computed_only``: the same, the callback declining the views ggml computes nothing for (as a
  capture does: it reads them when asked), so that each is computed with the next node: what no capture
  through llama.cpp's eval callback can beat;
- ``callback_statistics_only``: the same, the callback also reading each node's data (a view's when asked)
  and measuring it with the capture's own compiled statistics, recording nothing: what no summary capture
  through the eval callback can beat (its format holds every node's statistics);
- ``callback_statistics_and_wait``: the same, the callback then waiting ``WAIT_US`` (400 us, about what a
  summary capture spends on a node's records) before it returns: whether a longer callback costs ggml more
  than its own time (it would, were ggml's threads to sleep or its caches to cool while Python runs);
- ``full``: ``tracediff.capture(llm, out)`` around the decode (every node's payload and statistics);
- ``summary``: the same with ``tensors="summary"`` (statistics only);
- ``summary_without_journal``: ``summary`` with the capture's journal writing nothing (no trace survives a
  crash then: a diagnosis of what the journal's lines cost, not a configuration anyone runs);
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
import time
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
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, head_dim=64, max_position_embeddings=2048),
}
#: The sizes run at the defaults users have: a bfloat16 checkpoint, the converter's --outtype, llama.cpp's KV cache.
AT_DEFAULTS = frozenset({"1b"})
TOKENS = {"small": 64, "large": 128, "1b": 64}
WAIT_US = 400  # callback_statistics_and_wait's wait a node
#: Configurations run only when named in --configs: diagnoses of where a capture's time goes.
DIAGNOSES = frozenset({"callback_statistics_and_wait", "summary_without_journal"})


def build(cache: Path, size: str) -> Path:
    """The bench model's GGUF (F32; at the converter's default for ``AT_DEFAULTS``), made once into ``cache``."""
    import torch

    from tests.ports.llama_cpp_fixtures import checkpoint, convert, reference_model, train_tokenizer

    defaults = size in AT_DEFAULTS
    gguf = cache / (f"bench-{size}-auto.gguf" if defaults else f"bench-{size}-f32.gguf")
    if gguf.is_file():
        return gguf
    tokenizer = train_tokenizer(cache / "tokenizer")
    model = reference_model("LlamaConfig", "LlamaForCausalLM", SIZES[size])
    if defaults:
        model = model.to(torch.bfloat16)
    folder = checkpoint(model, cache / f"hf-{size}", tokenizer)
    del model
    return convert(folder, gguf, outtype="auto" if defaults else "f32")


def kv_cache_settings(size: str) -> dict[str, int]:
    """The ``Llama``'s KV cache arguments: F32 (rounds nothing); llama.cpp's default for ``AT_DEFAULTS``."""
    return {} if size in AT_DEFAULTS else {"type_k": 0, "type_v": 0}


def written(gguf: Path, tokens: list[int], out_root: Path, kv: dict[str, int]) -> tuple[list[int], int]:
    """The payload sizes a full capture writes, and its graph nodes (one capture, untimed)."""
    import llama_cpp

    import tracediff

    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=max(128, 2 * len(tokens)), logits_all=True, verbose=False,
                          **kv)
    out = Path(tempfile.mkdtemp(dir=out_root)) / "trace"
    try:
        with tracediff.capture(llm, out) as session:
            llm.eval(tokens)
        sizes = payload_sizes(out)
    finally:
        shutil.rmtree(out.parent)
    llm.close()
    return sizes, session.calls


def configurations(gguf: Path, tokens: list[int], out_root: Path,
                   kv: dict[str, int]) -> dict[str, Callable[[], None]]:
    import llama_cpp
    import numpy as np
    from llama_cpp import _internals

    import tracediff

    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=max(128, 2 * len(tokens)), logits_all=True, verbose=False,
                          **kv)
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

    def with_callback(answer: Callable[[int, bool, Any], bool]) -> Callable[[], None]:
        def run() -> None:
            params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
            callback = llama_cpp.ggml_backend_sched_eval_callback(answer)
            params.cb_eval, params.cb_eval_user_data = callback, None
            decode_in_context(params)
        return run

    from tracediff.capturing.adapters.llama_cpp import _ggml

    lib = _ggml(llama_cpp)

    def computed_only(node: int, ask: bool, _data: Any) -> bool:
        return not ask or not lib.computes_nothing(node)

    from tracediff.capturing.adapters.ggml_tensor import GgmlTensor, n_dims, read_data
    from tracediff.capturing.stats import CHUNK, _compiled_stats, float_summary
    from tracediff.trace.payload import as_floats

    kernel = _compiled_stats()

    def statistics_only(node: int, ask: bool, _data: Any) -> bool:
        """A summary capture's least work: each node's data read and measured by the capture's own kernel
        (views when asked, and declined), nothing recorded."""
        if ask and not lib.computes_nothing(node):
            return True
        tensor = GgmlTensor.from_address(node)
        shape = tuple(int(n) for n in tensor.ne[:n_dims(tensor)])[::-1]
        values = read_data(lib, tensor, shape).reshape(-1)
        if values.dtype == np.uint16:  # bfloat16's bits
            values = as_floats(values, "bfloat16", np.float32)
        if values.dtype.kind == "f" and values.size and kernel is not None:
            wide = values if values.dtype in (np.float32, np.float64) else values.astype(np.float32)
            float_summary(values.size, kernel.stats(np.ascontiguousarray(wide), CHUNK).tolist())
        return not ask

    def statistics_and_wait(node: int, ask: bool, data: Any) -> bool:
        answer = statistics_only(node, ask, data)
        if not (ask and answer):
            end = time.perf_counter() + WAIT_US * 1e-6
            while time.perf_counter() < end:
                pass
        return answer

    def captured(tensors: str, journal: bool = True) -> Callable[[], None]:
        from tracediff.capturing.journal import Journal

        def run() -> None:
            out = Path(tempfile.mkdtemp(dir=out_root)) / "trace"
            write = Journal._write
            if not journal:
                Journal._write = lambda _self, _entry: None  # type: ignore[method-assign]
            try:
                with tracediff.capture(llm, out, tensors=tensors):  # type: ignore[arg-type]
                    llm.eval(tokens)
            finally:
                Journal._write = write  # type: ignore[method-assign]
                shutil.rmtree(out.parent)
        return run

    return {"plain": plain, "plain_fresh_context": plain_fresh_context,
            "callback_only": with_callback(lambda _node, _ask, _data: True),
            "callback_computed_only": with_callback(computed_only),
            "callback_statistics_only": with_callback(statistics_only),
            "callback_statistics_and_wait": with_callback(statistics_and_wait),
            "full": captured("full"), "summary": captured("summary"),
            "summary_without_journal": captured("summary", journal=False)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="small")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=None, help="prompt length (default 64 small and 1b, 128 large)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "tracediff-bench-llama")
    parser.add_argument("--out-root", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--configs", help="comma-separated configurations to run (default: all but the diagnoses "
                        "callback_statistics_and_wait and summary_without_journal; plain always)")
    args = parser.parse_args(argv)
    import llama_cpp

    gguf = build(args.cache, args.size)
    count = args.tokens or TOKENS[args.size]
    tokens = [3 + (7 * i) % 97 for i in range(count)]
    kv = kv_cache_settings(args.size)
    sizes, nodes = written(gguf, tokens, args.out_root, kv)
    runs = configurations(gguf, tokens, args.out_root, kv)
    runs["write_floor"] = write_floor(sizes, args.out_root)
    if args.configs:
        chosen = {"plain", *args.configs.split(",")}
        unknown = chosen - set(runs)
        if unknown:
            parser.error(f"unknown configurations {', '.join(sorted(unknown))}: choose from {', '.join(runs)}")
        runs = {name: run for name, run in runs.items() if name in chosen}
    else:
        runs = {name: run for name, run in runs.items() if name not in DIAGNOSES}
    names = list(runs)
    medians, times, load = rotated_medians(runs, args.repeats)
    print(f"llama-cpp-python {llama_cpp.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {load:.1f} before the timing, {args.repeats} rounds, "
          f"{len(tokens)} tokens, --size {args.size} ({gguf.name}, {gguf.stat().st_size / 1e6:.0f} MB), "
          f"{'default F16' if not kv else 'F32'} KV cache, {nodes} graph "
          f"nodes, {sum(sizes) / 1e6:.0f} MB of payloads")
    print(f"{'config':24} {'median s':>9} {'x plain':>8}")
    for name in names:
        print(f"{name:24} {medians[name]:9.4f} {medians[name] / medians['plain']:7.2f}x")
    fresh = medians.get("plain_fresh_context", medians["plain"])
    for name in ("callback_only", "callback_computed_only", "callback_statistics_only",
                 "callback_statistics_and_wait", "summary", "summary_without_journal"):
        if name in medians:
            print(f"{name}: {medians[name] / medians['plain']:.2f}x plain, "
                  f"{(medians[name] - fresh) / max(nodes, 1) * 1e6:.0f} us per node beyond the run")
    if "full" in medians and "write_floor" in medians:
        floor = medians["plain"] + medians["write_floor"]
        per_full = (medians["full"] - fresh - medians["write_floor"]) / max(nodes, 1)
        print(f"full: {medians['full'] / floor:.2f}x (plain + write floor {floor:.4f} s), "
              f"{per_full * 1e6:.0f} us per node beyond the run and the write")
    if args.json is not None:
        record: dict[str, Any] = {"medians": medians, "times": times, "load": load, "size": args.size,
                                  "nodes": nodes, "payload_bytes": sum(sizes),
                                  "llama_cpp_python": llama_cpp.__version__}
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
