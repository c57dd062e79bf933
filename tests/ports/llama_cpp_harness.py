"""The llama.cpp part of the real-port suite: transformers (A) against llama.cpp running the GGUF conversion (B).

A transformers model is built from a tiny config with seeded random weights, saved as a checkpoint with a
sentencepiece tokenizer, and converted by llama.cpp's own ``convert_hf_to_gguf.py`` to an F32 GGUF
(tests/ports/llama_cpp_fixtures.py). Both sides run the same token ids: A under ``tracediff.capture`` (its
inputs saved as ``--save-inputs`` would), B through ``tracediff capture model.gguf --inputs FILE`` with an F32
KV cache and flash attention off (ggml's CPU flash attention rounds: docs/frameworks.md). A mistake is an
edit of the GGUF in place with gguf-py (``GGUFReader(path, "r+")``): a tensor's values (what a converter
writes wrong) or a metadata value (what it writes wrong or loses). Every case is
aligned with zero options (``tracediff align A B``). A case is right as in the torch suite
(tests/ports/harness.py): clean exits 0, a mistake exits 1 with its first divergence at the expected module
of A (transformers' path, relative to the root) or inside it, while the clean conversion passes (its rows
within ggml's GELU table, a float16 rounding, accepted within a derived bound: docs/verdicts.md;
``Family.clean_module``: a known divergence of a clean conversion).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import tracediff
from tests.ports.harness import CLEAN, Outcome, inside, relative
from tests.ports.llama_cpp_fixtures import (
    COMMON,
    SEQ,
    checkpoint,
    convert,
    reference_model,
    train_tokenizer,
)
from tracediff.cli.main import main as cli_main

MODE = "no map"
TOKENS = torch.randint(3, 100, (1, SEQ), generator=torch.Generator().manual_seed(3))  # ids the tokenizer has


@dataclass(frozen=True)
class GgufBug:
    """A conversion mistake planted in the GGUF, and the module of A where it must be named."""

    name: str
    what: str
    module: str
    edit: Callable[[Any, dict[str, Any]], None]  # (GGUFReader opened "r+", the family's config) -> None


@dataclass(frozen=True)
class Family:
    """One transformers family and llama.cpp's graph of it."""

    name: str
    config: str
    model: str
    settings: dict[str, Any]
    bugs: tuple[GgufBug, ...]
    # where the clean conversion is expected to diverge, for a rounding of llama.cpp's own (None: it passes)
    clean_module: str | None = None

    def bug(self, name: str) -> GgufBug:
        return next(bug for bug in self.bugs if bug.name == name)

    def cases(self) -> tuple[str, ...]:
        return (CLEAN, *(bug.name for bug in self.bugs))

    def reference(self) -> torch.nn.Module:
        return reference_model(self.config, self.model, self.settings)

    def hparams(self) -> dict[str, Any]:
        return {**COMMON, **self.settings}


@dataclass
class GgufRun:
    """Every trace and verdict of one family, made lazily into ``root``."""

    family: Family
    root: Path
    _traces: dict[str, Path] = field(default_factory=dict)
    _clean: Outcome | None = None

    @property
    def folder(self) -> Path:
        return self.root / self.family.name

    def inputs(self) -> Path:
        path = self.folder / "inputs.safetensors"
        if not path.is_file():
            from safetensors.torch import save_file

            path.parent.mkdir(parents=True, exist_ok=True)
            save_file({"kwargs.input_ids": TOKENS.contiguous()}, str(path))
        return path

    def gguf(self, case: str) -> Path:
        """The clean F32 conversion, or a copy of it with ``case``'s mistake planted."""
        tokenizer = train_tokenizer(self.root / "tokenizer")
        clean = convert(checkpoint(self.family.reference(), self.folder / "hf", tokenizer),
                        self.folder / "clean.gguf")
        if case == CLEAN:
            return clean
        return self.planted(clean, case, self.folder / f"{case}.gguf")

    def planted(self, clean: Path, case: str, path: Path) -> Path:
        """``path``: a copy of the GGUF ``clean`` with ``case``'s mistake planted by gguf-py (made once)."""
        if not path.is_file():
            import gguf

            shutil.copyfile(clean, path)
            reader = gguf.GGUFReader(path, "r+")
            self.family.bug(case).edit(reader, self.family.hparams())
            reader.data.flush()
            del reader
        return path

    def trace(self, case: str) -> Path:
        """``reference`` or a case's llama.cpp trace."""
        if case not in self._traces:
            out = self.folder / f"trace-{case}"
            if out.exists():
                shutil.rmtree(out)
            if case == "reference":
                model = self.family.reference()
                with torch.no_grad(), tracediff.capture(model, out):
                    model(input_ids=TOKENS)
            else:
                code, text = _cli(["capture", str(self.gguf(case)), "--inputs", str(self.inputs()), "--out", str(out),
                                   "--kv-cache-type", "f32", "--flash-attn", "off"])
                if code != 0:
                    raise RuntimeError(f"capture of {case} exited {code}: {text}")
            self._traces[case] = out
        return self._traces[case]

    def align(self, case: str) -> tuple[int, str | None, str]:
        """``tracediff align A B``: exit code, the first divergence's module of A (relative), a note."""
        report = self.folder / f"report-{case}.json"
        code, text = _cli(["align", str(self.trace("reference")), str(self.trace(case)), "--format", "json",
                           "--output", str(report)])
        if code not in (0, 1):
            return code, None, text.strip().splitlines()[-1] if text.strip() else ""
        first = json.loads(report.read_text())["first_divergence"]
        return code, relative(first["module_path_a"]) if first else None, ""

    def judge(self, case: str) -> Outcome:
        if case == CLEAN and self._clean is not None:
            return self._clean
        code, module, note = self.align(case)
        if case == CLEAN:
            known = self.family.clean_module
            right = code == 0 if known is None else code == 1 and inside(module, known)
            self._clean = Outcome(self.family.name, case, MODE, code, module, 0 if known is None else 1, known,
                                  right, note)
            return self._clean
        expected = self.family.bug(case).module
        right = code == 1 and inside(module, expected)
        if right and self.family.clean_module is None and self.judge(CLEAN).exit_code != 0:
            right, note = False, "the clean conversion diverges too"
        return Outcome(self.family.name, case, MODE, code, module, 1, expected, right, note)


def _cli(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli_main(argv)
    return code, out.getvalue()


# --- editing a GGUF in place ------------------------------------------------------------------------------------


def tensor(reader: Any, name: str) -> np.ndarray:
    """The writable data of tensor ``name`` (torch's order: [out, in] for a weight)."""
    found = next((t for t in reader.tensors if t.name == name), None)
    if found is None:
        raise KeyError(f"no tensor {name} in the GGUF")
    return found.data


def set_scalar(reader: Any, key: str, value: float) -> None:
    """A numeric metadata value replaced (same type, in place)."""
    field_ = reader.fields[key]
    field_.parts[field_.data[0]][0] = value


def rename_key(reader: Any, key: str, new: str) -> None:
    """A metadata key renamed to ``new`` of the same length: llama.cpp then reads its own default instead."""
    assert len(new) == len(key), (key, new)
    field_ = reader.fields[key]
    field_.parts[1][:] = np.frombuffer(new.encode(), dtype=np.uint8)


def rename_architecture(reader: Any, old: str, new: str) -> None:
    """``general.architecture`` and every ``old.*`` key renamed to ``new`` (same length): another graph."""
    assert len(old) == len(new)
    for key, field_ in list(reader.fields.items()):
        if key.startswith(f"{old}."):
            field_.parts[1][:] = np.frombuffer((new + key[len(old):]).encode(), dtype=np.uint8)
    arch = reader.fields["general.architecture"]
    arch.parts[arch.data[0]][:] = np.frombuffer(new.encode(), dtype=np.uint8)


def unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of the converter's q/k permutation (pairs side by side -> halves, per head)."""
    return rows.reshape(heads, rows.shape[0] // heads // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """The converter's q/k permutation (``LlamaModel.permute``): halves -> pairs side by side, per head."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def layers(config: dict[str, Any]) -> range:
    return range(config["num_hidden_layers"])


# --- the mistakes -------------------------------------------------------------------------------------------------


def qk_not_permuted() -> GgufBug:
    """q and k written as transformers holds them: llama.cpp's NORM rope then rotates the wrong pairs."""
    def edit(reader: Any, config: dict[str, Any]) -> None:
        for i in layers(config):
            q, k = tensor(reader, f"blk.{i}.attn_q.weight"), tensor(reader, f"blk.{i}.attn_k.weight")
            q[...] = unpermute(np.array(q), config["num_attention_heads"])
            k[...] = unpermute(np.array(k), config["num_key_value_heads"])

    return GgufBug("qk-not-permuted", "q/k rows left in transformers' order (no rotary permutation)",
                   "model.layers.0.self_attn", edit)


def v_permuted() -> GgufBug:
    """The q/k row permutation applied to v too: the attention mixes v's features within each head."""
    def edit(reader: Any, config: dict[str, Any]) -> None:
        for i in layers(config):
            v = tensor(reader, f"blk.{i}.attn_v.weight")
            v[...] = permute(np.array(v), config["num_key_value_heads"])

    # named where the mixed features first meet a recorded call: o_proj's input (the attention's output)
    return GgufBug("v-permuted", "the rotary row permutation applied to v_proj too", "model.layers.0.self_attn",
                   edit)


def norm_eps(key: str, value: float) -> GgufBug:
    """The norm eps written wrong (llama.cpp's LLaMA-2 default 1e-5 where the checkpoint says 1e-6)."""
    def edit(reader: Any, config: dict[str, Any]) -> None:
        set_scalar(reader, key, value)

    return GgufBug("norm-eps", f"{key} = {value:g} instead of the config's rms_norm_eps",
                   "model.layers.0.input_layernorm", edit)


def rope_base_lost(key: str) -> GgufBug:
    """The rope base not written: llama.cpp takes its default 10000 where the checkpoint says 500000."""
    def edit(reader: Any, config: dict[str, Any]) -> None:
        rename_key(reader, key, key[:-1] + "_")

    return GgufBug("rope-base-lost", f"{key} missing (llama.cpp's default 10000 used)", "model.layers.0.self_attn",
                   edit)


def gate_up_swapped() -> GgufBug:
    def edit(reader: Any, config: dict[str, Any]) -> None:
        for i in layers(config):
            gate, up = tensor(reader, f"blk.{i}.ffn_gate.weight"), tensor(reader, f"blk.{i}.ffn_up.weight")
            saved = np.array(gate)
            gate[...] = up
            up[...] = saved

    return GgufBug("gate-up-swapped", "ffn_gate and ffn_up written in each other's place", "model.layers.0.mlp",
                   edit)


def output_tied() -> GgufBug:
    """The model's own lm_head not written: the token embedding stands in for it (what llama.cpp does when
    ``output.weight`` is absent), planted as the embedding copied into ``output.weight``."""
    def edit(reader: Any, config: dict[str, Any]) -> None:
        tensor(reader, "output.weight")[...] = tensor(reader, "token_embd.weight")

    return GgufBug("output-tied", "output.weight not written (the token embedding used instead)", "lm_head", edit)


def embedding_rows_shifted() -> GgufBug:
    """The token embedding written one row off (a vocabulary off by one): every token reads its neighbour's row."""
    def edit(reader: Any, config: dict[str, Any]) -> None:
        rows = tensor(reader, "token_embd.weight")
        rows[...] = np.roll(np.array(rows), 1, axis=0)

    return GgufBug("embedding-rows-shifted", "token_embd.weight one row off", "model.embed_tokens", edit)


def bias_lost(which: str) -> GgufBug:
    """A q/k/v projection's bias not written (zero)."""
    def edit(reader: Any, config: dict[str, Any]) -> None:
        for i in layers(config):
            tensor(reader, f"blk.{i}.attn_{which}.bias")[...] = 0

    return GgufBug(f"{which}-bias-lost", f"attn_{which}.bias not written",
                   f"model.layers.0.self_attn.{which}_proj", edit)


def rope_type_norm(architecture: str) -> GgufBug:
    """The model converted under the ``llama`` architecture (NORM rope, pairs side by side) without the q/k
    permutation NORM needs: Qwen2's NEOX halves rotated as pairs."""
    def edit(reader: Any, config: dict[str, Any]) -> None:
        rename_architecture(reader, architecture, "llama")

    return GgufBug("rope-type-norm", f"{architecture} written as llama: NORM rope instead of NEOX",
                   "model.layers.0.self_attn", edit)


def gemma_norm_no_shift() -> GgufBug:
    """Gemma's norm weights written without the converter's ``+ 1`` (llama.cpp multiplies by the weight)."""
    def edit(reader: Any, config: dict[str, Any]) -> None:
        norm = tensor(reader, "blk.0.attn_norm.weight")
        norm[...] = norm - 1

    return GgufBug("norm-no-shift", "layer 0's attn_norm written as w instead of 1 + w",
                   "model.layers.0.input_layernorm", edit)


def gemma_k_norm(name: str, what: str, change: Callable[[np.ndarray], np.ndarray]) -> GgufBug:
    """Layer 0's k-norm weight written wrong (Gemma 3 normalises q and k per head before the rotary)."""
    def edit(reader: Any, config: dict[str, Any]) -> None:
        norm = tensor(reader, "blk.0.attn_k_norm.weight")
        norm[...] = change(np.array(norm))

    return GgufBug(name, what, "model.layers.0.self_attn.k_norm", edit)


def partial_rotary_lost(key: str) -> GgufBug:
    """The rotary dimension count not written: llama.cpp rotates the whole head where StableLM rotates a
    quarter. transformers rotates q and k in the attention's own code and records no call between the
    projections and ``o_proj``: the attention's output, ``o_proj``'s input, is where it shows first."""
    def edit(reader: Any, config: dict[str, Any]) -> None:
        rename_key(reader, key, key[:-1] + "_")

    return GgufBug("partial-rotary-lost", f"{key} missing (the whole head rotated)", "model.layers.0.self_attn",
                   edit)


# Gemma 3 as released: five sliding-window layers, then one global (llama.cpp hard-codes that pattern), with
# their rotary bases (llama.cpp hard-codes the sliding one); the sliding window is longer than the prompt, so
# the layer types differ by their bases alone
GEMMA3 = {"num_hidden_layers": 6, "sliding_window": 16, "tie_word_embeddings": True, "query_pre_attn_scalar": 16,
          "hidden_activation": "gelu_pytorch_tanh",
          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}

FAMILIES: dict[str, Family] = {family.name: family for family in (
    Family("llama", "LlamaConfig", "LlamaForCausalLM", {"rope_theta": 500000.0},
           (qk_not_permuted(), v_permuted(), norm_eps("llama.attention.layer_norm_rms_epsilon", 1e-5),
            rope_base_lost("llama.rope.freq_base"), gate_up_swapped(), output_tied(), embedding_rows_shifted())),
    Family("qwen2", "Qwen2Config", "Qwen2ForCausalLM", {},
           (bias_lost("k"), rope_type_norm("qwen2"), gate_up_swapped())),
    Family("gemma2", "Gemma2Config", "Gemma2ForCausalLM",
           {"sliding_window": 16, "tie_word_embeddings": True, "query_pre_attn_scalar": 16,
            "hidden_activation": "gelu_pytorch_tanh"},
           # ggml's CPU GELU reads a float16 table (GGML_GELU_FP16): accepted within its derived bound
           (gemma_norm_no_shift(),)),
    Family("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", GEMMA3,
           (gemma_k_norm("k-norm-no-shift", "layer 0's attn_k_norm written as w instead of 1 + w", lambda w: w - 1),
            gemma_k_norm("k-norm-scaled", "layer 0's attn_k_norm written twice too large", lambda w: 2 * w)),
           ),
    # layer_types is not written to the GGUF either: a checkpoint whose layer 1 is global converts without a
    # word, and llama.cpp rotates that layer with the sliding layers' base (logits 0.34 apart from the released
    # pattern's)
    Family("gemma3-global-1", "Gemma3TextConfig", "Gemma3ForCausalLM",
           {**GEMMA3, "layer_types": ["sliding_attention", "full_attention"] + ["sliding_attention"] * 3
            + ["full_attention"]}, (), clean_module="model.layers.1.self_attn"),
    Family("stablelm", "StableLmConfig", "StableLmForCausalLM", {"partial_rotary_factor": 0.25},
           (partial_rotary_lost("stablelm.rope.dimension_count"),)),
    Family("smollm3", "SmolLM3Config", "SmolLM3ForCausalLM", {}, (gate_up_swapped(),)),
    # no_rope_layers is not written to the GGUF: llama.cpp ropes every layer but each fourth, as released;
    # a checkpoint whose layer 1 has no rotary converts without a word and differs from there
    Family("smollm3-nope-1", "SmolLM3Config", "SmolLM3ForCausalLM", {"no_rope_layers": [1, 0]}, (),
           clean_module="model.layers.1.self_attn"),
)}
