"""Hashes of the random number generators' states (never the states themselves).

Entries, in this order:

* ``torch.cpu``: hash of ``torch.get_rng_state()`` (a tensor hash, see
  :mod:`tracediff.steps.hashing`), plus ``seed``, ``torch.initial_seed()``;
* ``torch.cuda.{i}``: hash of ``torch.cuda.get_rng_state(i)`` for every
  device, only when CUDA is already initialized (recording never initializes it);
* ``numpy``: numpy's global (legacy) generator, SHA-256 of
  ``"{bit_generator}|{pos}|{has_gauss}|{gauss!r}|"`` followed by the key words'
  bytes. Generators made with ``numpy.random.default_rng`` are not seen;
* ``python``: the ``random`` module, SHA-256 of ``"python|{version}|{gauss_next!r}|"``
  followed by the 625 state words as little-endian uint32.

Reading a state never advances a generator.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import torch

from .entries import error_entry
from .hashing import bytes_hash, tensor_hash


def rng_entries() -> dict[str, dict[str, Any]]:
    """The hashed RNG states, named as in the module docstring."""
    entries: dict[str, dict[str, Any]] = {}
    try:
        entries["torch.cpu"] = {"hash": tensor_hash(torch.get_rng_state()), "seed": torch.initial_seed()}
    except Exception as e:  # noqa: BLE001 - recording must never break a training step
        entries["torch.cpu"] = error_entry(e)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            try:
                entries[f"torch.cuda.{i}"] = {"hash": tensor_hash(torch.cuda.get_rng_state(i))}
            except Exception as e:  # noqa: BLE001
                entries[f"torch.cuda.{i}"] = error_entry(e)
    entries["numpy"] = _numpy_entry()
    entries["python"] = _python_entry()
    return entries


def _numpy_entry() -> dict[str, Any]:
    try:
        import numpy as np

        state = np.random.get_state(legacy=False)
        inner = state["state"]
        prefix = f"{state['bit_generator']}|{inner['pos']}|{state['has_gauss']}|{state['gauss']!r}|"
        keys = np.ascontiguousarray(inner["key"], dtype="<u4")
        return {"hash": bytes_hash(keys.tobytes(), prefix=prefix)}
    except Exception as e:  # noqa: BLE001
        return error_entry(e)


def _python_entry() -> dict[str, Any]:
    try:
        version, words, gauss_next = random.getstate()
        data = struct.pack(f"<{len(words)}I", *words)
        return {"hash": bytes_hash(data, prefix=f"python|{version}|{gauss_next!r}|")}
    except Exception as e:  # noqa: BLE001
        return error_entry(e)
