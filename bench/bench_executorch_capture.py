"""Cost of capturing an ExecuTorch run, as a ratio to ExecuTorch's plain run measured in the same process.

    python bench/bench_executorch_capture.py [--repeats 7] [--seq 64] [--xnnpack] [--json out.json]

Model: a transformers Llama (hidden 256, intermediate 688, 4 layers, 8 heads, 4 key/value heads, vocabulary
1000), random weights (seed 0), exported with ``torch.export.export(model, (), {"input_ids", "use_cache":
False})`` and ``executorch.exir.to_edge_transform_and_lower(..., generate_etrecord=True)`` (portable kernels;
``--xnnpack``: with the XNNPACK partitioner), float32, the program and its ETRecord written to a temp folder,
run by ExecuTorch's pybinding (``executorch.runtime``) on one sequence of ``--seq`` tokens.

Configurations, run interleaved in this one process (bench/rotated.py: one warm-up run each, then
``--repeats`` rounds that run every configuration once, the order rotated from round to round):

- ``plain``: ``Runtime.load_program(bytes)``, ``load_method("forward")``, ``execute``: what a user runs;
- ``etdump``: the same with ETDump and a debug buffer on, the ETDump and buffer written: the runtime's own cost;
- ``capture_file``: ``tracediff.capture_file("model.pte", out, inputs=..., options={"etrecord": ...})``, the
  whole user-facing call (it reads and checks the program and ETRecord, runs as ``etdump`` does, reads the
  ETDump and writes every output's payload and statistics);
- ``summary``: the same with ``tensors="summary"`` (statistics only).

Each capture writes into a fresh folder under ``--out-root`` (default: the system temp dir), deleted after it
is measured. Medians are printed with the ratio to ``plain``. Nothing here asserts.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from rotated import rotated_medians  # noqa: E402  (bench/, the script's own folder)

SETTINGS = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=4, vocab_size=1000, max_position_embeddings=1024)


def export(seq: int, folder: Path, xnnpack: bool) -> tuple[Path, Path, Any]:
    """The bench model exported: the program file, its ETRecord file, and the token ids."""
    import torch
    import transformers
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SETTINGS)).eval()
    ids = torch.randint(0, SETTINGS["vocab_size"], (1, seq), generator=torch.Generator().manual_seed(1))
    partitioner = []
    if xnnpack:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner = [XnnpackPartitioner()]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        exported = torch.export.export(model, (), {"input_ids": ids, "use_cache": False})
        manager = to_edge_transform_and_lower(exported, partitioner=partitioner,
                                              generate_etrecord=True).to_executorch()
    program, etrecord = folder / "model.pte", folder / "etrecord.bin"
    program.write_bytes(manager.buffer)
    manager.get_etrecord().save(str(etrecord))
    return program, etrecord, ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--xnnpack", action="store_true")
    parser.add_argument("--out-root", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from executorch.runtime import Runtime

    import tracediff

    with tempfile.TemporaryDirectory(dir=args.out_root) as root:
        folder = Path(root)
        program, etrecord, ids = export(args.seq, folder, args.xnnpack)
        data = program.read_bytes()
        runtime = Runtime.get()
        counter = iter(range(10**6))
        from tracediff.capturing.adapters.executorch import ExecuTorchAdapter

        # the debug buffer a capture gives this program (every node output twice over): a fixed size runs out
        buffer = ExecuTorchAdapter().load(program, {"etrecord": etrecord}).buffer_size()

        def plain() -> None:
            runtime.load_program(data).load_method("forward").execute([ids, False])

        def etdump() -> None:
            loaded = runtime.load_program(data, enable_etdump=True, debug_buffer_size=buffer)
            loaded.load_method("forward").execute([ids, False])
            loaded.write_etdump_result_to_file(str(folder / "run.etdp"), str(folder / "debug.bin"))

        def captured(tensors: str) -> None:
            out = folder / f"trace-{next(counter)}"
            tracediff.capture_file(program, out, inputs={"kwargs.input_ids": ids}, options={"etrecord": etrecord},
                                   tensors=tensors)  # type: ignore[arg-type]
            shutil.rmtree(out)

        runs = {"plain": plain, "etdump": etdump, "capture_file": lambda: captured("full"),
                "summary": lambda: captured("summary")}
        medians, times, load = rotated_medians(runs, args.repeats)
        size = program.stat().st_size
    base = medians["plain"]
    print(f"Llama {SETTINGS}, seq {args.seq}, {'XNNPACK' if args.xnnpack else 'portable'}, program {size:,} bytes, "
          f"{args.repeats} rounds, load average {load:.2f}, {os.cpu_count()} CPUs, {platform.processor()}")
    for name, median in medians.items():
        print(f"{name:>13}: {median * 1000:9.1f} ms  x{median / base:5.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"medians_s": medians, "times_s": times, "load": load,
                                               "seq": args.seq, "xnnpack": args.xnnpack, "settings": SETTINGS}))


if __name__ == "__main__":
    main()
