"""Cost of capturing an ONNX Runtime run, as a ratio to ONNX Runtime's plain run measured in the same process.

    python bench/bench_onnx_capture.py [--repeats 7] [--seq 256] [--json out.json]

Model: a transformers Llama (hidden 512, intermediate 1376, 8 layers, 8 heads, 8 key/value heads, vocabulary
1024, float32), random weights (seed 0), exported by torch's dynamo exporter (``torch.onnx.export(model, (ids,),
kwargs={"use_cache": False}, dynamo=True)``), run by ONNX Runtime on the CPU (``CPUExecutionProvider``) at its
default optimization level and threads, on one sequence of ``--seq`` token ids. Needs the onnx extra.

Configurations, run interleaved in this one process: one warm-up run each, then ``--repeats`` rounds that run
every configuration once, in an order rotated from round to round so that drift of a noisy machine spreads
evenly:

- ``plain``: ``session.run(None, feeds)`` on a session of the model as exported, made once: ONNX Runtime's own
  work and nothing else;
- ``marked_run``: the same run on a session whose outputs also hold every node's output (what a capture runs),
  made once, nothing recorded: how much of the cost is ONNX Runtime returning every value;
- ``marked_fresh``: the marked graph serialized, a session made of it and run once, nothing recorded: what a
  capture from a ``ModelProto`` cannot do without (ONNX Runtime returns the values only from a session of
  the marked graph);
- ``full``: ``tracediff.capture_file(model, out, inputs=...)``: the whole capture, from the ``ModelProto`` to the
  written trace (the marked session made, the run, every node's payload and statistics);
- ``summary``: the same with ``tensors="summary"`` (statistics only);
- ``write_floor``: writing the bytes a full capture writes, as payload files of the same sizes, to a fresh
  folder: with ``plain``, what no full capture can beat.

Each capture writes into a fresh folder under ``--out-root`` (default: the system temp dir), deleted after it is
measured. Medians are printed with the ratio to ``plain``. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from rotated import payload_sizes, rotated_medians, write_floor  # noqa: E402  (bench/, the script's own folder)

SETTINGS = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8,
                num_key_value_heads=8, vocab_size=1024, max_position_embeddings=1024)


def build(seq: int) -> tuple[Any, Any]:
    """The bench model exported as an ``onnx.ModelProto``, and its token ids."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SETTINGS)).eval()
    ids = torch.randint(0, SETTINGS["vocab_size"], (1, seq), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        proto = torch.onnx.export(model, (ids,), kwargs={"use_cache": False}, dynamo=True).model_proto
    return proto, ids


def configurations(proto: Any, ids: Any, out_root: Path) -> dict[str, Callable[[], None]]:
    import onnxruntime as ort

    import tracediff
    from tracediff.capturing.adapters.onnx_nodes import marked_bytes, plan_outputs

    feeds = {"input_ids": ids.numpy()}
    plain_session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    planned, _ = plan_outputs(proto.graph)
    keys = [p.key for p in planned]
    marked_session = ort.InferenceSession(marked_bytes(proto, keys), providers=["CPUExecutionProvider"])

    def plain() -> None:
        plain_session.run(None, feeds)

    def marked_run() -> None:
        marked_session.run(keys, feeds)

    def marked_fresh() -> None:
        session = ort.InferenceSession(marked_bytes(proto, keys), providers=["CPUExecutionProvider"])
        session.run(keys, feeds)

    def captured(tensors: str) -> Callable[[], None]:
        def run() -> None:
            out = Path(tempfile.mkdtemp(dir=out_root)) / "trace"
            try:
                tracediff.capture_file(proto, out, inputs={"kwargs.input_ids": ids}, tensors=tensors)
            finally:
                shutil.rmtree(out.parent)
        return run

    return {"plain": plain, "marked_run": marked_run, "marked_fresh": marked_fresh, "full": captured("full"),
            "summary": captured("summary")}


def written(proto: Any, ids: Any, out_root: Path) -> list[int]:
    """The payload sizes of one full capture (for the write floor)."""
    import tracediff

    out = Path(tempfile.mkdtemp(dir=out_root)) / "trace"
    try:
        tracediff.capture_file(proto, out, inputs={"kwargs.input_ids": ids})
        return payload_sizes(out)
    finally:
        shutil.rmtree(out.parent)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--out-root", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import onnxruntime

    proto, ids = build(args.seq)
    runs = configurations(proto, ids, args.out_root)
    runs["write_floor"] = write_floor(written(proto, ids, args.out_root), args.out_root)
    names = list(runs)
    medians, times, load = rotated_medians(runs, args.repeats)
    print(f"onnxruntime {onnxruntime.__version__}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average {load:.1f} before the timing, {args.repeats} rounds, "
          f"{args.seq} tokens, {len(proto.graph.node)} nodes")
    print(f"{'config':12} {'median s':>9} {'x plain':>8}")
    for name in names:
        print(f"{name:12} {medians[name]:9.4f} {medians[name] / medians['plain']:7.2f}x")
    floor = medians["plain"] + medians["write_floor"]
    print(f"full: {medians['full'] / floor:.2f}x (plain + write floor {floor:.4f} s); summary: "
          f"{medians['summary'] / medians['plain']:.2f}x plain; the marked session made and run alone: "
          f"{medians['marked_fresh'] / medians['plain']:.2f}x plain")
    if args.json is not None:
        record: dict[str, Any] = {"medians": medians, "times": times, "load": load,
                                  "onnxruntime": onnxruntime.__version__, "seq": args.seq}
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
