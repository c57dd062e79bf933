"""Do two versions of tracediff report the same alignments? Dump reports with each, then compare them.

    python bench/align_equivalence.py corpus /tmp/corpus > pairs.txt     # writes low-precision ports
    PYTHONPATH=/path/to/old python bench/align_equivalence.py dump old.json $(cat pairs.txt)
    python bench/align_equivalence.py dump new.json $(cat pairs.txt)
    python bench/align_equivalence.py compare old.json new.json

``corpus`` writes, for Llama, GPT-2 and BERT of ``tests/verdicts/ports.py``, an
fp32 reference, its bf16 cast, a bf16 port (eager attention), an fp16 port with
a scaled weight and an fp64 port, and prints them as pairs next to the
fixtures' (``A:B`` or ``A:B:BASELINE``; add more, such as the bench traces).

``dump`` writes ``tracediff.align(A, B[, baseline=N]).to_dict()`` for each pair
with the ``tracediff`` it imports (run it from a folder without a
``tracediff`` of its own, or the current folder's wins over ``PYTHONPATH``).
``compare`` checks that every field of every report is equal, except the
metrics summed in float32 (``mean_abs_err``, ``rms_err``, ``cosine``, and
``pcc`` since it is accumulated in the comparison's pass: how far it moved
is printed relative to ``1 - pcc``), and
measures those against float64 values computed from the payloads (the
reference definitions of ``tracediff.compare.metrics``; rows with
saturated values or a layout transform are left out of that measure).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

FLOAT32_SUMS = ("mean_abs_err", "rms_err", "cosine")
ONE_PASS = ("pcc",)  # accumulated in the comparison's chunked pass since issue 34 (float32 chunks, float64 sums)


def corpus(folder: str) -> None:
    from pathlib import Path

    import torch

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    from tests.verdicts.ports import build, capture, port

    out, fixtures = Path(folder), root / "fixtures"
    tiny = fixtures / "llama_tiny"
    pairs = [f"{tiny}/ref:{tiny}/port_bug", f"{tiny}/ref:{tiny}/native", f"{tiny}/native:{tiny}/port_bug",
             f"{tiny}/repr:{tiny}/ref", f"{fixtures}/gpt2_tiny/ref:{fixtures}/gpt2_tiny/ref",
             f"{fixtures}/bert_tiny/ref:{fixtures}/bert_tiny/ref"]
    for arch in ("llama", "gpt2", "bert"):
        ref, base = capture(build(arch), out / f"{arch}_ref"), capture(build(arch), out / f"{arch}_base_bf16",
                                                                      torch.bfloat16)
        bf16 = port(arch, out / f"{arch}_bf16", dtype=torch.bfloat16)
        bug = port(arch, out / f"{arch}_fp16_bug", dtype=torch.float16, bugs=[("scaled-weight", 1)])
        fp64 = port(arch, out / f"{arch}_fp64", dtype=torch.float64)
        pairs += [f"{ref}:{bf16}:{base}", f"{ref}:{bug}", f"{ref}:{fp64}", f"{bf16}:{bug}", f"{ref}:{base}",
                  f"{bf16}:{base}"]
    print("\n".join(pairs))


def dump(out: str, pairs: list[str]) -> None:
    import tracediff

    reports = []
    for pair in pairs:
        a, b, *baseline = pair.split(":")
        report = tracediff.align(a, b, baseline=baseline[0] if baseline else None).to_dict()
        reports.append({"pair": [a, b, *baseline], "report": report})
    with open(out, "w") as f:
        json.dump(reports, f, default=repr)
    print(f"{len(reports)} reports from {tracediff.__file__}")


def _differences(x: Any, y: Any, where: str) -> list[str]:
    """Paths where ``x`` and ``y`` differ, float32-summed metrics excepted."""
    if isinstance(x, dict) and isinstance(y, dict):
        if x.keys() != y.keys():
            return [f"{where}: keys differ"]
        return [d for k in x for d in _differences(x[k], y[k], f"{where}.{k}")]
    if isinstance(x, list) and isinstance(y, list):
        if len(x) != len(y):
            return [f"{where}: {len(x)} vs {len(y)} items"]
        return [d for i, (u, v) in enumerate(zip(x, y)) for d in _differences(u, v, f"{where}[{i}]")]
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return []
    if x != y and where.rpartition(".")[2] not in FLOAT32_SUMS + ONE_PASS:
        return [f"{where}: {x!r} vs {y!r}"]
    return []


def compare(old_path: str, new_path: str) -> int:
    import numpy as np

    import tracediff
    from tracediff.compare.metrics import METRICS

    with open(old_path) as f:
        old = json.load(f)
    with open(new_path) as f:
        new = json.load(f)
    differences = [d for o, n in zip(old, new) for d in _differences(o, n, ":".join(o["pair"]))]
    rows = sum(len(o["report"]["rows"]) for o in old)
    print(f"{len(old)} reports, {rows} rows; fields that differ (other than {', '.join(FLOAT32_SUMS)}): "
          f"{len(differences)}")
    for line in differences[:20]:
        print("  " + line)
    for key in FLOAT32_SUMS:
        apart = [abs(x[key] - y[key]) / max(abs(x[key]), abs(y[key])) for o, n in zip(old, new)
                 for x, y in zip(o["report"]["rows"], n["report"]["rows"])
                 if isinstance(x[key], float) and x[key] == x[key] and x[key] != y[key]]
        print(f"{key}: {len(apart)} rows differ, by at most {max(apart, default=0.0):.2e} (relative)")
    for key in ONE_PASS:  # how far apart, measured against the distance from perfect correlation
        apart = [abs(x[key] - y[key]) / max(1 - x[key], 1e-12) for o, n in zip(old, new)
                 for x, y in zip(o["report"]["rows"], n["report"]["rows"])
                 if isinstance(x[key], float) and isinstance(y[key], float) and x[key] == x[key] and x[key] != y[key]]
        absolute = [abs(x[key] - y[key]) for o, n in zip(old, new)
                    for x, y in zip(o["report"]["rows"], n["report"]["rows"])
                    if isinstance(x[key], float) and isinstance(y[key], float) and x[key] == x[key]]
        print(f"{key}: {len(apart)} rows differ, by at most {max(apart, default=0.0):.2e} of 1 - {key} "
              f"(median {float(np.median(apart)) if apart else 0.0:.2e}), at most {max(absolute, default=0.0):.2e} "
              f"in absolute terms")
    errors: dict[str, dict[str, list[float]]] = {k: {"old": [], "new": []} for k in FLOAT32_SUMS}
    for o, n in zip(old, new):
        trace_a, trace_b = tracediff.load_trace(o["pair"][0]), tracediff.load_trace(o["pair"][1])
        records_a = {(node.module_path, node.call_index, r.slot): r for node, r in trace_a.records()}
        records_b = {(node.module_path, node.call_index, r.slot): r for node, r in trace_b.records()}
        for x, y in zip(o["report"]["rows"], n["report"]["rows"]):
            if x["status"] not in ("close", "diverged") or x["approximate"] or x.get("transform") \
                    or "saturated" in x["reason"]:
                continue
            ra = records_a.get((x["module_path_a"], x["call_index_a"], x["tensor_a"]))
            rb = records_b.get((x["module_path_b"], x["call_index_b"], x["tensor"]))
            if ra is None or rb is None or ra.shape != rb.shape:
                continue
            pa, pb = trace_a.load_payload(ra), trace_b.load_payload(rb)
            if not all(p.dtype.startswith(("float", "bfloat")) for p in (pa, pb)):
                continue
            for key in FLOAT32_SUMS:
                exact = METRICS[key](pa, pb)
                if exact and math.isfinite(exact):
                    errors[key]["old"].append(abs(x[key] - exact) / abs(exact))
                    errors[key]["new"].append(abs(y[key] - exact) / abs(exact))
    for key, found in errors.items():
        if found["old"]:
            e_old, e_new = np.array(found["old"]), np.array(found["new"])
            print(f"{key}: {e_old.size} rows, relative error against float64: old median {np.median(e_old):.2e}, "
                  f"largest {e_old.max():.2e}; new median {np.median(e_new):.2e}, largest {e_new.max():.2e}")
    return 1 if differences else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("corpus").add_argument("folder")
    d = sub.add_parser("dump")
    d.add_argument("out")
    d.add_argument("pairs", nargs="+", metavar="A:B[:BASELINE]")
    c = sub.add_parser("compare")
    c.add_argument("old")
    c.add_argument("new")
    args = parser.parse_args()
    if args.what == "corpus":
        corpus(args.folder)
        return 0
    if args.what == "dump":
        dump(args.out, args.pairs)
        return 0
    return compare(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())
