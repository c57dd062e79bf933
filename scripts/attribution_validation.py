"""The attribution's ranking against the one-at-a-time scan it replaces: the table of docs/accuracy.md.

    python scripts/attribution_validation.py [--layers 8] [--out table.md]

For each model (a Llama-style decoder: logits KL; an MLP-heavy residual
regressor: relative mse; both from ``tests/attribution/models.py``, random
weights, seed 0, layers of different weight; and the Llama again with a 40x
outlier channel in layer 3's norm gains, as trained LLMs have) and each
quantization (torchao int4 weight-only, int8 weight-only, int8 dynamic
activations; optimum-quanto qint4 and qint8 weights), B is the float model with every decoder layer's
Linears quantized. The attribution ranks B's layers from A's trace; the scan
quantizes one layer of a fresh float copy at a time and measures the final
error. Printed: Spearman's rank correlation of the two over layers, whether
the top layer agrees, and each one's forward passes and wall time (CPU, one
thread). Nothing here asserts; the tests do (tests/attribution).
"""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tracediff  # noqa: E402
from tests.attribution import models  # noqa: E402
from tests.attribution.test_ranking import spearman  # noqa: E402
from tracediff.attribution import attribute, sensitivity_scan  # noqa: E402

QUANTIZATIONS = {"torchao int4 weight-only (groups of 32)": lambda: models.torchao("int4wo"),
                 "torchao int8 weight-only": lambda: models.torchao("int8wo"),
                 "torchao int8 dynamic activations + int8 weights": lambda: models.torchao("int8dyn"),
                 "optimum-quanto qint4 weights": lambda: models.quanto("qint4"),
                 "optimum-quanto qint8 weights": lambda: models.quanto("qint8")}


def families(layers: int) -> dict[str, tuple[torch.nn.Module, dict[str, torch.Tensor], str]]:
    return {"Llama (logits KL)": (models.llama(layers=layers), {"input_ids": models.token_ids()}, "model.layers"),
            "MLP stack (relative mse)": (models.mlp_stack(layers=layers), {"x": models.mlp_inputs()}, "blocks"),
            "Llama, outlier channel in layer 3": (models.llama(layers=layers, outlier=3),
                                                  {"input_ids": models.token_ids()}, "model.layers")}


def row(name: str, quant: str, float_model: torch.nn.Module, kwargs: dict[str, torch.Tensor], layers: str,
        folder: Path) -> str:
    quantize = QUANTIZATIONS[quant]()
    b = copy.deepcopy(float_model)
    quantize(b, layers)
    started = time.perf_counter()
    result = attribute(b, folder)
    attribution_s = time.perf_counter() - started
    paths = [c.module_path.split(".", 1)[1] for c in result.ranking]
    scan = sensitivity_scan(float_model, quantize, paths, kwargs)
    truth = [scan.errors[p] for p in paths]
    rho = spearman(truth, [c.share for c in result.ranking])
    worst = max(scan.errors, key=scan.errors.__getitem__)
    top = f"yes ({worst.rsplit('.', 1)[-1]})" if paths[0] == worst else f"no ({worst})"
    return (f"| {name} | {quant} | {result.final_error.value:.3g} | {rho:.3f} | {top} | "
            f"{result.forward_passes}, {attribution_s:.2f} s | {scan.forward_passes}, {scan.seconds:.2f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    lines = ["| model | quantization | B's final error | Spearman over layers | same top layer | attribution: "
             "forwards, time | scan: forwards, time |", "|---|---|---|---|---|---|---|"]
    for name, (float_model, kwargs, layers) in families(args.layers).items():
        tmp = Path(tempfile.mkdtemp(prefix="attribution-validation-"))
        try:
            with tracediff.capture(float_model, tmp / "float"):
                float_model(**kwargs)
            for quant in QUANTIZATIONS:
                lines.append(row(name, quant, float_model, kwargs, layers, tmp / "float"))
                print(lines[-1], flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
