"""Cost of capturing an OpenVINO run, as a ratio to OpenVINO's plain inference measured in the same run.

    python bench/bench_openvino_capture.py [--repeats 7] [--seq 256] [--json out.json]

Model: a transformers Llama (hidden 512, intermediate 1408, 8 layers, 8 heads, 4 key/value heads, vocabulary
1000), random weights (seed 0), converted with ``ov.convert_model(model, example_input={input_ids,
attention_mask})`` (float32 weights, never saved), run by OpenVINO's CPU plugin at its defaults (its default
INFERENCE_PRECISION_HINT: bf16 on a CPU with AVX-512 bf16 or AMX, else f32; its default threads) on one
sequence of ``--seq`` tokens.

Configurations, run interleaved in this one process (bench/rotated.py: one warm-up run each, then
``--repeats`` rounds that run every configuration once, the order rotated from round to round):

- ``plain``: the converted model compiled as it is, ``request.infer(inputs)``: what a user runs;
- ``outputs_added``: the model tracediff compiles (every recorded value a model output), run, nothing
  recorded: the cost of the outputs alone (and of the fusions they prevent);
- ``full``: ``tracediff.capture`` around that prepared model's run (every node's payload and statistics);
- ``summary``: the same with ``tensors="summary"`` (statistics only);
- ``capture_file``: ``tracediff.capture_file(ov_model, out, inputs=...)``: the whole user-facing call, which
  also copies the model, adds the outputs and compiles it;
- ``write_floor``: writing the bytes a full capture writes, as payload files of the same sizes, to a fresh
  folder: with ``plain``, what no full capture can beat.

Each capture writes into a fresh folder under ``--out-root`` (default: the system temp dir), deleted after
it is measured. Medians are printed with the ratio to ``plain``. Nothing here asserts.
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

SETTINGS = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                num_key_value_heads=4, vocab_size=1000, max_position_embeddings=1024)


def convert(seq: int) -> tuple[Any, dict[str, Any]]:
    """The bench model converted by OpenVINO, and its inputs by name."""
    import openvino as ov
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SETTINGS, use_cache=False)).eval()
    ids = torch.randint(0, SETTINGS["vocab_size"], (1, seq), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return ov.convert_model(model, example_input=inputs), inputs


def configurations(model: Any, inputs: dict[str, Any], out_root: Path) -> tuple[dict[str, Callable[[], None]], Any]:
    import openvino as ov

    import tracediff
    from tracediff.capturing.adapters.openvino import OpenVINOAdapter

    adapter = OpenVINOAdapter()
    plain_request = ov.Core().compile_model(model, "CPU").create_infer_request()
    feed = {name: tensor.numpy() for name, tensor in inputs.items()}
    prepared = adapter.load(model, {})
    added_request = prepared.compiled.create_infer_request()

    def plain() -> None:
        plain_request.infer(feed)

    def outputs_added() -> None:
        added_request.infer(feed)

    def fresh() -> Path:
        return Path(tempfile.mkdtemp(dir=out_root)) / "trace"

    def captured(tensors: str) -> Callable[[], None]:
        def run() -> None:
            out = fresh()
            try:
                with tracediff.capture(prepared, out, tensors=tensors):  # type: ignore[arg-type]
                    adapter.run_inputs(prepared, inputs)
            finally:
                shutil.rmtree(out.parent)
        return run

    def capture_file() -> None:
        out = fresh()
        try:
            tracediff.capture_file(model, out, inputs=inputs)
        finally:
            shutil.rmtree(out.parent)

    runs = {"plain": plain, "outputs_added": outputs_added, "full": captured("full"), "summary": captured("summary"),
            "capture_file": capture_file}
    out = fresh()
    try:  # one full capture before the timing: the sizes of the write floor
        with tracediff.capture(prepared, out):  # type: ignore[arg-type]
            adapter.run_inputs(prepared, inputs)
        runs["write_floor"] = write_floor(payload_sizes(out), out_root)
    finally:
        shutil.rmtree(out.parent)
    return runs, prepared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--out-root", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import openvino as ov

    model, inputs = convert(args.seq)
    runs, prepared = configurations(model, inputs, args.out_root)
    names = list(runs)
    medians, times, load = rotated_medians(runs, args.repeats)
    print(f"openvino {ov.__version__.split('-')[0]}, inference precision {prepared.inference_precision}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average {load:.1f} before "
          f"the timing, {args.repeats} rounds, {args.seq} tokens, {len(prepared.nodes)} recorded values")
    print(f"{'config':14} {'median s':>9} {'x plain':>8}")
    for name in names:
        print(f"{name:14} {medians[name]:9.4f} {medians[name] / medians['plain']:7.2f}x")
    floor = medians["plain"] + medians["write_floor"]
    print(f"full: {medians['full'] / floor:.2f}x (plain + write floor {floor:.4f} s); summary: "
          f"{medians['summary'] / medians['plain']:.2f}x plain")
    if args.json is not None:
        record: dict[str, Any] = {"medians": medians, "times": times, "load": load, "openvino": ov.__version__,
                                  "inference_precision": prepared.inference_precision, "seq": args.seq}
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
