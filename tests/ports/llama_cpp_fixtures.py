"""The llama.cpp fixtures, made at test time: tiny transformers checkpoints and their GGUF conversions.

Nothing is committed and nothing comes from a model hub:

* a sentencepiece tokenizer trained on a few lines of text (``tokenizer.model``; the converter reads it);
* a transformers model of each family from a tiny config with seeded random weights (hidden size 64, two
  layers, vocabulary 300), saved with ``save_pretrained``;
* its GGUF conversion by llama.cpp's own ``convert_hf_to_gguf.py``, from the llama-cpp-python sdist whose
  library is installed (the converter, its ``conversion/`` package and its ``gguf-py``; the ``gguf`` release on
  PyPI lags the converter, so the sdist's copy runs it). The sdist is fetched once with
  ``pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==VERSION`` and those three parts are kept in
  ``$TRACEDIFF_CACHE`` (default ``~/.cache/tracediff``); ``TRACEDIFF_LLAMA_CPP_SDIST`` names a tarball to use
  instead.

Run as a script to make one family's checkpoint and GGUF by hand:
``python -m tests.ports.llama_cpp_fixtures llama /tmp/llama``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import runpy
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

LLAMA_CPP_PYTHON = "0.3.36"  # constraints.txt pins the same version
VOCAB, SEQ = 300, 8
COMMON: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                              rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                              bos_token_id=1, eos_token_id=2, pad_token_id=0)
TEXT = """The quick brown fox jumps over the lazy dog near the river bank.
A small model reads a few lines of text and learns how words are split.
Numbers like 1 2 3 and 42 appear between letters, commas, and full stops.
Every layer of the network adds its part to the residual stream of tokens.
Rotary position embeddings turn pairs of features by an angle per position.
Grouped query attention shares each key and value head among query heads.
"""
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion", "gguf-py")


def require_llama_cpp(install: str) -> Any:
    """The imported llama_cpp, or the module skipped naming why (not installed, or built without its library)."""
    import pytest

    try:
        import llama_cpp
    except (ImportError, OSError) as e:
        pytest.skip(f"llama-cpp-python {LLAMA_CPP_PYTHON} is not usable ({type(e).__name__}: {e}): {install}",
                    allow_module_level=True)
    return llama_cpp


def cache_root() -> Path:
    return Path(os.environ.get("TRACEDIFF_CACHE") or Path.home() / ".cache" / "tracediff")


def converter() -> Path:
    """The folder holding llama.cpp's converter of the pinned llama-cpp-python (fetched once, then cached)."""
    folder = cache_root() / f"llama-cpp-python-{LLAMA_CPP_PYTHON}"
    if all((folder / part).exists() for part in CONVERTER_PARTS):
        return folder
    sdist = os.environ.get("TRACEDIFF_LLAMA_CPP_SDIST")
    with tempfile.TemporaryDirectory() as scratch:
        if not sdist:
            # --no-binary for this one package only: with :all: pip builds the sdist's build tools (cmake) from
            # source just to read its metadata, minutes of a 2-core machine
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--no-binary", "llama-cpp-python", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", scratch],
                           check=True)
            sdist = str(next(Path(scratch).glob("llama_cpp_python-*.tar.gz")))
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
        staging = Path(tempfile.mkdtemp(dir=cache_root() if cache_root().exists() else None))
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(prefix)
                       and m.name[len(prefix):].split("/")[0] in CONVERTER_PARTS and (m.isfile() or m.isdir())]
            for member in members:
                member.name = member.name[len(prefix):]
            archive.extractall(staging, members=members, filter="data")
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            staging.rename(folder)
        except OSError:  # another test process (pytest-xdist's other worker) put its copy there first
            shutil.rmtree(staging, ignore_errors=True)
            if not all((folder / part).exists() for part in CONVERTER_PARTS):
                raise
    return folder


def train_tokenizer(out: Path) -> Path:
    """A sentencepiece model (``tokenizer.model``) trained on ``TEXT``, offline and deterministic."""
    import sentencepiece as spm

    model = out / "tokenizer.model"
    if model.is_file():
        return model
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "corpus.txt"
    corpus.write_text(TEXT * 4)
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(out / "tokenizer"), vocab_size=200,
                                   model_type="unigram", hard_vocab_limit=False, character_coverage=1.0,
                                   bos_id=1, eos_id=2, unk_id=3, pad_id=0, num_threads=1, seed_sentencepiece_size=1000,
                                   minloglevel=2)
    corpus.unlink()
    (out / "tokenizer.vocab").unlink(missing_ok=True)
    return model


def spread_norms(model: torch.nn.Module) -> torch.nn.Module:
    """transformers' norm weights start at one (Gemma's at zero): make them count, so a norm mistake shows."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                param.uniform_(-0.5, 0.5)
    return model


def reference_model(config_class: str, model_class: str, settings: dict[str, Any]) -> torch.nn.Module:
    """The transformers model of a family, seeded, in float32, eval mode."""
    import transformers

    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**{**COMMON, **settings})
    return spread_norms(getattr(transformers, model_class)(config).eval())


def checkpoint(model: torch.nn.Module, folder: Path, tokenizer: Path,
               edit_config: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """``model`` saved as a transformers checkpoint with the sentencepiece tokenizer beside it."""
    if (folder / "config.json").is_file():
        return folder
    model.save_pretrained(folder)
    (folder / "tokenizer.model").write_bytes(tokenizer.read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    if edit_config is not None:
        config = json.loads((folder / "config.json").read_text())
        edit_config(config)
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def convert(folder: Path, out: Path, *, outtype: str = "f32", tool: Path | None = None) -> Path:
    """``convert_hf_to_gguf.py folder --outfile out --outtype outtype``: llama.cpp's converter, offline.

    It runs in this process (torch and transformers are imported once: a converter process spends a minute
    importing them on two busy cores), with its own ``gguf-py`` as ``gguf`` while it runs; the modules it
    imported are dropped afterwards and an earlier ``gguf`` put back.
    """
    if out.is_file():
        return out
    tool = tool or converter()
    saved_modules = {name: module for name, module in sys.modules.items() if _converter_module(name)}
    saved_path, saved_argv = list(sys.path), list(sys.argv)
    for name in saved_modules:
        del sys.modules[name]
    sys.path[:0] = [str(tool / "gguf-py"), str(tool)]
    sys.argv = ["convert_hf_to_gguf.py", str(folder), "--outfile", str(out), "--outtype", outtype]
    try:
        with _offline():
            _read_sentencepiece()
            runpy.run_path(str(tool / "convert_hf_to_gguf.py"), run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise RuntimeError(f"convert_hf_to_gguf.py failed on {folder} (exit {e.code})") from None
    finally:
        sys.path[:], sys.argv[:] = saved_path, saved_argv
        for name in [name for name in sys.modules if _converter_module(name)]:
            del sys.modules[name]
        sys.modules.update(saved_modules)
        logging.getLogger().handlers.clear()  # the converter configures the root logger
    if not out.is_file():
        raise RuntimeError(f"convert_hf_to_gguf.py wrote no {out}")
    return out


# converter classes that read only a BPE ``tokenizer.json`` whose pre-tokenizer they must know by its hash
# (a released model's): they read the sentencepiece model of these checkpoints instead. The vocabulary changes
# no number of the graph; the token ids come from the inputs file.
SENTENCEPIECE_VOCAB = {"conversion.stablelm": "StableLMModel", "conversion.qwen": "Qwen3MoeModel"}


def _read_sentencepiece() -> None:
    import importlib

    for module, name in SENTENCEPIECE_VOCAB.items():
        model = getattr(importlib.import_module(module), name)
        model.set_vocab = model._set_vocab_sentencepiece


def _converter_module(name: str) -> bool:
    return name.split(".")[0] in ("gguf", "conversion")


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main(argv: list[str]) -> int:
    family, out = argv[0], Path(argv[1])
    from tests.ports.llama_cpp_harness import FAMILIES

    port = FAMILIES[family]
    tokenizer = train_tokenizer(out / "tokenizer")
    folder = checkpoint(port.reference(), out / "hf", tokenizer)
    print(convert(folder, out / f"{family}-f32.gguf"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
