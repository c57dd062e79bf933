"""Test helpers: the JSON trees of a trace folder, their nodes, tensor entries and payloads; a disk that fills up."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

Node = dict[str, Any]


def trace_json(folder: Path, kind: str = "FULL_TENSORS") -> Node:
    """The one ``*_debug_tree_{kind}.json`` of ``folder``, parsed."""
    (path,) = folder.glob(f"*_debug_tree_{kind}.json")
    return json.loads(path.read_text())


def metadata(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "tracediff_metadata.json").read_text())


def nodes(tree: Node) -> Iterator[Node]:
    """Every call node, depth first, parents before children, then later top-level calls."""
    yield tree
    for child in tree.get("children", []):
        yield from nodes(child)
    for later in tree.get("subsequent_calls", []):
        yield from nodes(later)


def find(tree: Node, path: str, call_index: int | None = None) -> list[Node]:
    """The nodes of module ``path`` (and ``call_index`` when given), in call order."""
    found = [n for n in nodes(tree) if n["module_path"] == path]
    if call_index is not None:
        found = [n for n in found if n.get("call_index") == call_index]
    return found


def tensor_entries(value: Any) -> Iterator[dict[str, Any]]:
    """Every tensor entry (a dict with ``shape`` and ``dtype``) inside an inputs/outputs value."""
    if isinstance(value, dict):
        if "shape" in value and "dtype" in value:
            yield value
            return
        for item in value.values():
            yield from tensor_entries(item)
    elif isinstance(value, list):
        for item in value:
            yield from tensor_entries(item)


def payload(folder: Path, entry: dict[str, Any] | str) -> torch.Tensor:
    """The tensor a JSON entry (or a ``./file.safetensors`` value) points to."""
    relative = entry if isinstance(entry, str) else entry["value"]
    assert relative.startswith("./") and "/" not in relative[2:], relative
    with safe_open(str(folder / relative[2:]), framework="pt") as f:
        assert list(f.keys()) == ["data"]
        return f.get_tensor("data")


def payload_fingerprint(path: Path) -> tuple[list[str], list[tuple[str, tuple[int, ...], bytes]]]:
    """Keys, metadata, and per key dtype, shape and raw bytes of a safetensors file."""
    with safe_open(str(path), framework="pt") as f:
        keys = sorted(f.keys())
        tensors = [f.get_tensor(k) for k in keys]
        meta = sorted((f.metadata() or {}).items())
    raw = [(str(t.dtype), tuple(t.shape), t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
           for t in tensors]
    return [*keys, *(f"{k}={v}" for k, v in meta)], raw


def files(folder: Path) -> set[str]:
    """Names of the files in ``folder`` (recursively, relative), hidden temporary files included."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


class DiskFillsUp:
    """``os.replace`` of payload files fails with ENOSPC after ``allowed`` of them (JSON still fits)."""

    def __init__(self, allowed: int, *, json_too: bool = False) -> None:
        self.allowed, self.json_too, self.real = allowed, json_too, os.replace
        self.payloads, self.refused = 0, []

    def __call__(self, src: str, dst: str) -> None:
        is_payload = str(dst).endswith(".safetensors")
        if is_payload:
            self.payloads += 1
        if self.payloads > self.allowed and (is_payload or self.json_too):
            self.refused.append(Path(dst).name)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.real(src, dst)
