"""Import speed: a ``tensors`` dump of about 1 GB written as a trace by ``tracediff.importers.import_dump``.

    python bench/bench_import.py                                   # 1024 MB of .npy in 64 files, 3 repeats
    python bench/bench_import.py --format safetensors --files 256 --mb 1024
    python bench/bench_import.py --format pt                       # through torch.load(weights_only=True)

The dump is ``--files`` float32 tensors of equal size (``--mb`` in all, seed
0), one per file named ``{i:04d}_layers.{i}.npy`` (or ``.safetensors`` /
``.pt``), in ``--dir`` (default: a temporary folder, removed at the end).
Each repeat imports it into a fresh trace folder beside it and removes that
folder afterwards; the figure is payload bytes (10^9) per second of wall
time, the median and the best of the repeats. For scale, the same repeats time a plain copy of every file
(``shutil.copyfile``), the floor of any import that writes a copy. The page
cache is warm (the dump was just written and is read again each repeat);
the trace written is on the same file system. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tracediff.importers import import_dump  # noqa: E402


def write_dump(folder: Path, *, mb: int, files: int, file_format: str) -> int:
    """Write the dump; returns its payload bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    numel = mb * (1 << 20) // 4 // files
    rng = np.random.default_rng(0)
    for i in range(files):
        array = rng.standard_normal(numel, dtype=np.float32).reshape(-1, 1024)
        path = folder / f"{i:04d}_layers.{i}.{file_format}"
        if file_format == "npy":
            np.save(path, array)
        elif file_format == "safetensors":
            from safetensors.numpy import save_file

            save_file({"output": array}, str(path))
        else:
            import torch

            torch.save(torch.from_numpy(array), path)
    return files * array.nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024)
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--format", choices=["npy", "safetensors", "pt"], default="npy")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="where to write the dump (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="tracediff-bench-import-"))
    try:
        dump = root / "dump"
        payload = write_dump(dump, mb=args.mb, files=args.files, file_format=args.format)
        imports, copies = [], []
        for repeat in range(args.repeats):
            out = root / f"trace{repeat}"
            started = time.perf_counter()
            result = import_dump("tensors", dump, out=out)
            imports.append(time.perf_counter() - started)
            assert result.payload_bytes == payload and result.tensors == args.files
            shutil.rmtree(out)
            copy = root / f"copy{repeat}"
            copy.mkdir()
            started = time.perf_counter()
            for path in sorted(dump.iterdir()):
                shutil.copyfile(path, copy / path.name)
            copies.append(time.perf_counter() - started)
            shutil.rmtree(copy)
        figures = {
            "format": args.format, "files": args.files, "payload_bytes": payload, "repeats": args.repeats,
            "import_seconds": imports, "copy_seconds": copies,
            "import_gb_per_s_median": payload / 1e9 / statistics.median(imports),
            "copy_gb_per_s_median": payload / 1e9 / statistics.median(copies),
            "import_gb_per_s_best": payload / 1e9 / min(imports),
            "copy_gb_per_s_best": payload / 1e9 / min(copies),
        }
        print(f"{payload / 1e9:.3f} GB in {args.files} .{args.format} files: import "
              f"{figures['import_gb_per_s_median']:.2f} GB/s, best {figures['import_gb_per_s_best']:.2f} "
              f"(median of {args.repeats}: "
              f"{', '.join(f'{s:.3f} s' for s in imports)}); plain copy {figures['copy_gb_per_s_median']:.2f} GB/s, "
              f"best {figures['copy_gb_per_s_best']:.2f} ({', '.join(f'{s:.3f} s' for s in copies)})")
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
