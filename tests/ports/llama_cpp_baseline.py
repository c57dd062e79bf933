"""Lossy llama.cpp runs judged with ``--baseline``: quantized GGUFs and the F16 KV cache.

A lossy run rounds on purpose, so the zero-option alignment against the float32 reference diverges on a clean
conversion. The baseline N is the reference under B's rounding, with A's module paths:

* a Q8_0 or F16 GGUF: the reference on the GGUF's own dequantized weights, transformers' ``from_pretrained(folder,
  gguf_file=...)`` of the GGUF, or the reference with each matrix rounded through gguf-py's
  ``quants.quantize``/``dequantize`` (the same blocks the converter writes, made without the GGUF under test);
* the F16 KV cache: the reference run in float16 (``--dtype float16``), whose rounding bounds the cache's.

Mistakes are planted as in tests/ports/llama_cpp_harness.py, in the lossy GGUF itself (a Q8_0 tensor is
edited as its raw blocks: swapping two tensors of one shape swaps their blocks).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import tracediff
from tests.ports.harness import CLEAN, relative
from tests.ports.llama_cpp_fixtures import convert
from tests.ports.llama_cpp_harness import TOKENS, GgufRun, _cli


@dataclass(frozen=True)
class Judged:
    """One alignment: its exit code, the first divergence's module of A (relative), and what the CLI printed."""

    exit_code: int
    module: str | None
    text: str


@dataclass
class LossyRun:
    """The traces of one family's lossy runs, made lazily beside ``run``'s (same reference, same token ids)."""

    run: GgufRun

    @property
    def folder(self) -> Path:
        return self.run.folder

    def gguf(self, outtype: str, case: str = CLEAN) -> Path:
        """The checkpoint converted to ``outtype`` (``q8_0``, ``f16``, ``f32``), with ``case``'s mistake planted."""
        self.run.gguf(CLEAN)  # the checkpoint and the tokenizer
        clean = convert(self.folder / "hf", self.folder / f"clean-{outtype}.gguf", outtype=outtype)
        if case == CLEAN:
            return clean
        return self.run.planted(clean, case, self.folder / f"{case}-{outtype}.gguf")

    def llama_cpp(self, gguf: Path, *, kv_cache: str = "f32") -> Path:
        """llama.cpp's trace of ``gguf`` (flash attention off), with the KV cache of type ``kv_cache``."""
        out = self.folder / f"trace-{gguf.stem}-kv-{kv_cache}"
        if not out.exists():
            code, text = _cli(["capture", str(gguf), "--inputs", str(self.run.inputs()), "--out", str(out),
                               "--kv-cache-type", kv_cache, "--flash-attn", "off"])
            if code != 0:
                raise RuntimeError(f"capture of {gguf.name} exited {code}: {text}")
        return out

    def reference_from_gguf(self, gguf: Path) -> Path:
        """transformers' model loaded from ``gguf`` (its weights dequantized to float32), traced."""
        import transformers

        out = self.folder / f"trace-transformers-{gguf.stem}"
        if not out.exists():
            model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                                      dtype=torch.float32).eval()
            self._trace(model, out)
        return out

    def reference_rounded(self, qtype_name: str) -> Path:
        """The reference with every matrix rounded through gguf-py's quantizer of ``qtype_name`` (``Q8_0``)."""
        import gguf

        out = self.folder / f"trace-reference-{qtype_name}"
        if not out.exists():
            qtype = gguf.GGMLQuantizationType[qtype_name]
            model = self.run.family.reference()
            with torch.no_grad():
                for param in model.parameters():
                    if param.ndim == 2:
                        rounded = gguf.quants.dequantize(gguf.quants.quantize(param.numpy(), qtype), qtype)
                        param.copy_(torch.from_numpy(rounded.reshape(param.shape)))
            self._trace(model, out)
        return out

    def reference_in(self, dtype: torch.dtype) -> Path:
        """The reference cast to ``dtype`` (what ``tracediff capture --dtype`` does), traced."""
        out = self.folder / f"trace-reference-{str(dtype).removeprefix('torch.')}"
        if not out.exists():
            self._trace(self.run.family.reference().to(dtype), out)
        return out

    def align(self, b: Path, baseline: Path | None = None) -> Judged:
        """``tracediff align A B [--baseline N]`` with A the float32 reference."""
        report = self.folder / "report.json"
        report.unlink(missing_ok=True)
        argv = ["align", str(self.run.trace("reference")), str(b), "--format", "json", "--output", str(report)]
        if baseline is not None:
            argv += ["--baseline", str(baseline)]
        code, text = _cli(argv)
        if code not in (0, 1):
            return Judged(code, None, text)
        first: dict[str, Any] | None = json.loads(report.read_text())["first_divergence"]
        return Judged(code, relative(first["module_path_a"]) if first else None, text)

    @staticmethod
    def _trace(model: torch.nn.Module, out: Path) -> None:
        with torch.no_grad(), tracediff.capture(model, out):
            model(input_ids=TOKENS)


def f16_cache_cost(root: Path) -> str:
    """One line: what llama.cpp's default F16 KV cache costs against an F32 cache, on the same F32 GGUF."""
    from tests.ports.llama_cpp_harness import FAMILIES

    lossy = LossyRun(GgufRun(FAMILIES["llama"], root))
    gguf = lossy.gguf("f32")
    result = tracediff.align(lossy.llama_cpp(gguf), lossy.llama_cpp(gguf, kv_cache="f16"))
    changed = [row for row in result.rows if row.max_abs_err]
    logits = max(row.max_abs_err or 0.0 for row in result.rows if row.module_path_a.endswith("result_output")
                 and row.tensor == "outputs")
    first = changed[0]
    return (f"F16 KV cache against F32 (same GGUF, flash attention off): logits max_abs_err={logits:.3g}; first "
            f"changed at {first.module_path_a} {first.tensor} (max_abs_err={first.max_abs_err:.3g}); first "
            f"divergence at {result.first_divergence.module_path_a if result.first_divergence else None}")


if __name__ == "__main__":
    import sys

    print(f16_cache_cost(Path(sys.argv[1])))
