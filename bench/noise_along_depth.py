"""Noise ratio along depth: clean and buggy low-precision ports against an fp32 reference and its baseline.

For each architecture, dtype and seed: the reference A (fp32, sdpa attention), the baseline N (the
reference cast to the dtype: its own noise), a clean port (the dtype, eager attention) and a buggy
port (the same with one planted bug in the middle layer). Each port is aligned against A with N as
baseline; the noise ratio of every compared tensor (error over the noise floor) is recorded.

Prints, per configuration, the largest noise ratio of the clean port (what the noise factor must
accept) and the noise ratio and growth at the buggy port's first divergence (what it must reject),
and writes a PNG of the noise ratio along depth for a clean and a buggy bf16 Llama port::

    python bench/noise_along_depth.py --out noise_along_depth.png
    python bench/noise_along_depth.py --archs llama --dtypes bfloat16 --seeds 0 --device cuda

The defaults (3 architectures, bf16 and fp16, 2 seeds, 6 layers, a down-projection weight scaled by
1.05 in layer 3) take about 4 minutes on a quiet 2-core machine.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tracediff  # noqa: E402
from tests.verdicts.ports import IDS, build, plant  # noqa: E402


def capture(model: torch.nn.Module, out: Path, dtype: torch.dtype, device: str) -> Path:
    model = model.to(device=device, dtype=dtype)
    with torch.no_grad(), tracediff.capture(model, out):
        model(input_ids=IDS.to(device))
    return out


def run(archs: list[str], dtypes: list[str], seeds: list[int], layers: int, bug: str, device: str,
        root: Path) -> tuple[list[dict[str, object]], dict[str, list[tuple[int, float]]]]:
    results: list[dict[str, object]] = []
    curves: dict[str, list[tuple[int, float]]] = {}
    middle = layers // 2
    for arch in archs:
        for seed in seeds:
            ref = capture(build(arch, layers=layers, seed=seed), root / f"{arch}-{seed}-ref", torch.float32, device)
            for name in dtypes:
                dtype = getattr(torch, name)
                tag = f"{arch}-{seed}-{name}"
                base = capture(build(arch, layers=layers, seed=seed), root / f"{tag}-base", dtype, device)
                clean = capture(build(arch, attn="eager", layers=layers, seed=seed), root / f"{tag}-clean", dtype,
                                device)
                buggy_model = plant(build(arch, attn="eager", layers=layers, seed=seed), bug, middle)
                buggy = capture(buggy_model, root / f"{tag}-bug", dtype, device)
                clean_result = tracediff.align(ref, clean, baseline=base)
                bug_result = tracediff.align(ref, buggy, baseline=base)
                ratios = [r.noise_ratio for r in clean_result.rows if r.noise_ratio is not None]
                rms_ratios = [r.rms_err / f.rms_err for r, f in _pairs(ref, clean, base) if f.rms_err > 0]
                first = bug_result.first_divergence
                results.append({
                    "arch": arch, "dtype": name, "seed": seed, "tensors": len(clean_result.rows),
                    "clean_max_ratio": max(ratios), "clean_p99_ratio": _quantile(ratios, 0.99),
                    "clean_max_rms_ratio": max(rms_ratios) if rms_ratios else math.nan,
                    "clean_passed": clean_result.passed, "bug_first": f"{first.module_path_b} {first.tensor}"
                    if first else None, "bug_ratio": first.noise_ratio if first else None,
                    "bug_growth": first.growth if first else None, "bug_sources": len(bug_result.sources),
                })
                if arch == archs[0] and seed == seeds[0] and name == dtypes[0]:
                    curves["clean"] = [(r.order, r.noise_ratio) for r in clean_result.rows if r.noise_ratio]
                    curves["buggy"] = [(r.order, r.noise_ratio) for r in bug_result.rows if r.noise_ratio]
                    curves["label"] = f"{arch}, {name} port vs fp32 reference, baseline: reference in {name}"
                    curves["bug"] = f"{bug} in layer {middle}"  # type: ignore[assignment]
    return results, curves


def _pairs(ref: Path, port: Path, base: Path) -> list[tuple[object, object]]:
    rows = tracediff.align(ref, port).rows
    floors = {(r.module_path_b, r.call_index, r.tensor): r for r in tracediff.align(ref, base).rows}
    return [(r, floors[(r.module_path_b, r.call_index, r.tensor)]) for r in rows
            if (r.module_path_b, r.call_index, r.tensor) in floors and not math.isnan(r.rms_err)]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def draw(curves: dict[str, object], k: float, out: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="constrained")
    ax = fig.add_subplot()
    for key, colour in (("clean", "#2563eb"), ("buggy", "#c62828")):
        points = curves[key]
        assert isinstance(points, list)
        label = "clean port (eager attention)" if key == "clean" else f"buggy port ({curves['bug']})"
        ax.plot([p[0] for p in points], [p[1] for p in points], color=colour, linewidth=1.3, marker="o",
                markersize=2, label=label)
    ax.axhline(k, color="#16a34a", linestyle="--", linewidth=1.2, label=f"noise factor {k:g}")
    ax.axhline(1, color="#6b7280", linestyle=":", linewidth=1, label="the noise floor")
    ax.set_yscale("log")
    ax.set_xlabel("compared tensor, in execution order (depth grows to the right)")
    ax.set_ylabel("noise ratio: error / noise floor")
    ax.set_title(str(curves["label"]), fontsize=10, loc="left")
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    ax.grid(True, color="#e5e7eb", linewidth=0.6)
    fig.savefig(out, dpi=130)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", default="llama,gpt2,bert")
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--bug", default="scaled-weight-5%",
                        choices=["scaled-weight-5%", "scaled-weight", "wrong-norm", "attention-scale", "norm-eps"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("noise_along_depth.png"))
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results, curves = run(args.archs.split(","), args.dtypes.split(","), [int(s) for s in args.seeds.split(",")],
                              args.layers, args.bug, args.device, Path(tmp))
    from tracediff.alignment.verdicts.noise import DEFAULT_NOISE_FACTOR

    print(f"{'arch':6} {'dtype':9} {'seed':>4} {'tensors':>7} {'clean max':>9} {'p99':>6} {'rms max':>7} "
          f"{'passes':>6}  {'bug ratio':>9} {'growth':>7} {'sources':>7}  first divergence of the buggy port")
    for r in results:
        print(f"{r['arch']:6} {r['dtype']:9} {r['seed']:>4} {r['tensors']:>7} {r['clean_max_ratio']:>9.2f} "
              f"{r['clean_p99_ratio']:>6.2f} {r['clean_max_rms_ratio']:>7.2f} {str(r['clean_passed']):>6}  "
              f"{r['bug_ratio'] or 0:>9.2f} {r['bug_growth'] or 0:>7.2f} {r['bug_sources']:>7}  {r['bug_first']}")
    clean_max = max(float(r["clean_max_ratio"]) for r in results)  # type: ignore[arg-type]
    bug_min = min(float(r["bug_ratio"] or 0) for r in results)  # type: ignore[arg-type]
    print(f"largest clean noise ratio {clean_max:.2f}; smallest bug noise ratio {bug_min:.2f}; "
          f"noise factor {DEFAULT_NOISE_FACTOR:g}; {time.perf_counter() - start:.0f} s on {args.device}")
    draw(curves, DEFAULT_NOISE_FACTOR, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
