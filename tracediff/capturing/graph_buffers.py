"""A compiled graph's buffers: a value the capture already wrote is not written again.

Inductor hands each ``tracediff::record`` (:mod:`.record_op`) the buffer the compiled code computed into.
It reuses a buffer in place once its value is dead, without bumping the tensor's version counter, and it
may compute one value into two buffers (a pointwise op recomputed inside the kernel that reads it): the
same object or the same memory at a later record may hold another value, and the same value may come in
other memory. Eager capture's rule (the same object, unchanged: its entry again) cannot hold, and without
another rule every module's input is written a second time, the output of the call before it.

The rule here takes a record's tensor for a value written earlier on the evidence of its bytes: a CPU
tensor of the same dtype, shape and strides as a payload written earlier (the one written from the same
memory, and the latest of that layout), whose bytes are that payload's, compared whole with the payload:
with its file once written (mapped: the page cache holds it, as a rule), or with the writer thread's host
copy while its file is still being written (``PayloadPipeline.pending_copy``). Either holds the payload's
bytes, so what is shared never depends on how far the writers have got. Equal bytes are the same value,
which is what a shared entry says (docs/trace-format.md). Among the last ``LIMIT`` payloads; anything else
is written as before.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import weakref
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..files.payloads import byte_view

#: How many written graph buffers are kept as candidates (a module's input is its caller's, or the call
#: before it's output: a recent record).
LIMIT = 64

_MARKED: dict[int, weakref.ref[torch.Tensor]] = {}


def mark(tensor: torch.Tensor) -> torch.Tensor:
    """Note ``tensor`` (a detached view of a record's buffer) as a compiled graph's; returns it."""
    key = id(tensor)

    def forget(_ref: weakref.ref[torch.Tensor], key: int = key) -> None:
        _MARKED.pop(key, None)

    _MARKED[key] = weakref.ref(tensor, forget)
    return tensor


def is_marked(tensor: torch.Tensor) -> bool:
    """True when ``tensor`` is a compiled graph's buffer handed to a record (:func:`mark`)."""
    ref = _MARKED.get(id(tensor))
    return ref is not None and ref() is tensor


def _layout(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    if tensor.device.type != "cpu" or tensor.is_sparse or tensor.numel() == 0:
        return None
    return (tensor.dtype, tuple(tensor.shape), tensor.stride())


class WrittenBuffers:
    """The payloads written for graph buffers, by where their values lay and by layout; the last ``LIMIT``."""

    def __init__(self, limit: int = LIMIT) -> None:
        self._limit = limit
        self._by_place: OrderedDict[tuple[Any, ...], tuple[dict[str, Any], Path]] = OrderedDict()
        self._by_layout: dict[tuple[Any, ...], tuple[dict[str, Any], Path]] = {}

    def remember(self, tensor: torch.Tensor, entry: dict[str, Any], path: Path) -> None:
        """``entry``'s payload, to be written at ``path``, holds ``tensor``'s bytes as they are now."""
        layout = _layout(tensor)
        if layout is None:
            return
        place = (tensor.data_ptr(), tensor.storage_offset(), *layout)
        self._by_place[place] = self._by_layout[layout] = (entry, path)
        self._by_place.move_to_end(place)
        while len(self._by_place) > self._limit:
            self._by_place.popitem(last=False)
        if len(self._by_layout) > self._limit:
            self._by_layout.clear()  # many layouts: the latest of each is kept again from here

    def entry_for(self, tensor: torch.Tensor, pending: Callable[[Path], torch.Tensor | None] | None = None
                  ) -> dict[str, Any] | None:
        """The entry of an earlier payload that holds ``tensor``'s bytes now (see the module docstring);
        ``pending`` gives the host copy of a payload whose file a writer thread has yet to finish."""
        layout = _layout(tensor)
        if layout is None:
            return None
        place = (tensor.data_ptr(), tensor.storage_offset(), *layout)
        candidates = [self._by_place.get(place), self._by_layout.get(layout)]
        if candidates[0] is candidates[1]:
            candidates.pop()
        data: torch.Tensor | None = None
        for found in candidates:
            if found is None:
                continue
            if data is None:
                data = byte_view(tensor)
            copy = pending(found[1]) if pending is not None else None
            if _same_bytes(byte_view(copy), data) if copy is not None else _holds(found[1], data):
                return found[0]
        return None

    def clear(self) -> None:
        self._by_place.clear()
        self._by_layout.clear()


def _holds(path: Path, data: torch.Tensor) -> bool:
    """True when the payload file ``path`` ends with the bytes ``data`` (flat ``uint8``; a payload's bytes
    follow its header). The file is mapped, not read: its pages are compared where the page cache holds them."""
    size = data.numel()
    head = data[:min(64, size)].numpy().tobytes()
    try:
        with path.open("rb") as f:
            end = os.fstat(f.fileno()).st_size
            if end < size:
                return False
            f.seek(end - size)
            if f.read(len(head)) != head:  # most other values differ in their first bytes: read no further
                return False
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                memcmp = _memcmp()
                if memcmp is None:
                    return mapped[end - size:end] == data.numpy().tobytes()
                written = np.frombuffer(mapped, dtype=np.uint8, count=size, offset=end - size)
                try:
                    return bool(memcmp(written.ctypes.data, data.data_ptr(), size) == 0)
                finally:
                    del written  # the map closes only once no array holds it
    except (OSError, ValueError):  # not written (a write that failed), or removed: no evidence
        return False


def _same_bytes(copy: torch.Tensor, data: torch.Tensor) -> bool:
    """True when the flat ``uint8`` tensors ``copy`` and ``data`` hold the same bytes."""
    size = data.numel()
    if copy.numel() != size:
        return False
    memcmp = _memcmp()
    if memcmp is None:
        return bool(torch.equal(copy, data))
    return bool(memcmp(copy.data_ptr(), data.data_ptr(), size) == 0)


@functools.lru_cache(maxsize=1)
def _memcmp() -> Any:
    """The C library's ``memcmp`` (one pass, several GB/s; numpy's and torch's equality are a few times
    slower), or None where the process has no C library to look it up in (Windows)."""
    try:
        function = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes, function.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t], ctypes.c_int
    return function
