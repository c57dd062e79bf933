"""The JSON entry recorded for one tensor or one plain value, and for a nested batch.

A tensor entry::

    {"hash": "9f2c...", "shape": [64, 32], "dtype": "float32", "device": "cpu",
     "stats": {"min": -0.12, "max": 0.13, ...}}

A plain value entry (JSON-safe values: None, bool, int, float, str and lists
and str-keyed dicts of those)::

    {"py_type": "float", "py_value": 0.001}

(the typed values of traces, see ``tracediff.format``; records of tracediff
0.1 hold the value under ``"value"``, which is still read).

Anything else is kept as ``{"py_type": "MyClass", "repr": "...", "hash": ...}``
with the SHA-256 of its full ``repr``. An entry that could not be recorded is
``{"error": "TypeError: ..."}``: recording never raises into training.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Collection, Mapping
from typing import Any, cast

import torch

from .. import format as fmt
from ..capturing.distributed import is_dtensor
from .hashing import bytes_hash, dtype_name, tensor_hash
from .tensor_stats import tensor_stats

_REPR_LIMIT = 200
_MAX_DEPTH = 32


def tensor_entry(tensor: torch.Tensor, stats: Collection[str]) -> dict[str, Any]:
    """Hash, shape, dtype, device and the requested statistics of ``tensor``.

    A DTensor (FSDP2's ``fully_shard``, tensor parallelism) is recorded whole: its full tensor is gathered,
    a collective every rank must join in the same order, and its placements are kept under ``placements``.
    """
    try:
        placements = None
        if is_dtensor(tensor):
            placements = [repr(p) for p in getattr(tensor, "placements", ())]
            tensor = cast(Any, tensor).full_tensor()
        entry: dict[str, Any] = {
            "hash": tensor_hash(tensor),
            "shape": list(tensor.shape),
            "dtype": dtype_name(tensor.dtype),
            "device": str(tensor.device),
        }
        numbers = tensor_stats(tensor, stats)
        if numbers:
            entry["stats"] = numbers
        if placements is not None:
            entry["placements"] = placements
        return entry
    except Exception as e:  # noqa: BLE001 - recording must never break a training step
        return error_entry(e)


def value_entry(value: Any) -> dict[str, Any]:
    """A plain value as JSON, or its type and ``repr`` (with a hash of the full repr)."""
    if isinstance(value, torch.Tensor):
        return tensor_entry(value, ())
    if fmt.is_json_safe(value):
        return fmt.typed_value(value)
    try:
        text = repr(value)
    except Exception as e:  # noqa: BLE001
        return error_entry(e)
    short = text if len(text) <= _REPR_LIMIT else text[:_REPR_LIMIT] + "..."
    return {**fmt.typed_repr(type(value).__qualname__, short), "hash": bytes_hash(text.encode())}


def error_entry(exc: BaseException) -> dict[str, Any]:
    message = str(exc).splitlines()[0] if str(exc) else ""
    return {"error": f"{type(exc).__name__}: {message}"[:_REPR_LIMIT]}


def batch_entries(batch: Any, stats: Collection[str]) -> tuple[Any, dict[str, dict[str, Any]]]:
    """Flatten a nested batch into named entries, keeping its structure.

    Names are paths from ``batch``: ``batch`` for a lone tensor,
    ``batch.input_ids`` for a dict key, ``batch.0`` for a tuple position,
    ``batch.0.mask`` when nested. Tensors and numpy arrays get tensor entries,
    anything else a value entry. The structure mirrors the batch with leaves
    replaced by ``{"tensor": name}``, ``{"ndarray": name}`` or ``{"value": name}``.
    """
    entries: dict[str, dict[str, Any]] = {}
    structure = _walk(batch, "batch", stats, entries, 0)
    return structure, entries


def _walk(value: Any, name: str, stats: Collection[str], entries: dict[str, dict[str, Any]], depth: int) -> Any:
    if isinstance(value, torch.Tensor):
        entries[name] = tensor_entry(value, stats)
        return {"tensor": name}
    array = _numpy_tensor(value)
    if array is not None:
        entries[name] = tensor_entry(array, stats)
        return {"ndarray": name}
    if depth < _MAX_DEPTH:
        if isinstance(value, Mapping):
            items = {str(k): _walk(v, f"{name}.{k}", stats, entries, depth + 1) for k, v in value.items()}
            return {"type": type(value).__name__, "items": items}
        if isinstance(value, (list, tuple)):
            seq = [_walk(v, f"{name}.{i}", stats, entries, depth + 1) for i, v in enumerate(value)]
            return {"type": type(value).__name__, "items": seq}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: _walk(getattr(value, f.name), f"{name}.{f.name}", stats, entries, depth + 1)
                      for f in dataclasses.fields(value)}
            return {"type": type(value).__name__, "items": fields}
    entries[name] = value_entry(value)
    return {"value": name}


def _numpy_tensor(value: Any) -> torch.Tensor | None:
    """A numpy array as a CPU tensor sharing its bytes, or None (not an array, or an object array)."""
    if type(value).__module__ != "numpy" or not hasattr(value, "dtype") or not hasattr(value, "shape"):
        return None
    import numpy as np

    if not isinstance(value, np.ndarray) or value.dtype.hasobject:
        return None
    array = np.ascontiguousarray(value)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    try:
        with warnings.catch_warnings():  # read-only arrays: we only read the bytes
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(array)
    except (TypeError, ValueError):  # a dtype torch does not have (e.g. strings)
        return None
