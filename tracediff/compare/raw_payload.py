"""Bitwise-equal payload pairs, found without decoding them.

Two payloads that hold one tensor each, with the same dtype, the same shape
and the same bytes, are identical: no metric needs the values. ``same_bytes``
checks that straight from the files: it reads the two safetensors headers,
then compares the data in chunks of ``CHUNK_BYTES`` read into two reused
buffers, and stops at the first chunk that differs (for a pair that differs
anywhere, usually the first). Memory stays at two chunks per thread whatever
the tensor size; nothing is converted, so a bf16 pair costs its bytes only.

Anything unusual (not a regular file, a header it cannot read, several
tensors, a key other than ``data``, offsets outside the file) answers False, and the caller decodes the
pair the usual way, which reports the problem properly.
"""

from __future__ import annotations

import os
import stat
import threading

from ..errors import TracediffError
from ..format import PAYLOAD_HEADER_LIMIT, PAYLOAD_KEY, PayloadLayout, payload_layouts
from ..trace.load import Trace
from ..trace.model import TensorRecord
from .metrics import PairMetrics, identical_metrics

CHUNK_BYTES = 1 << 19  # two buffers of a chunk stay in a core's L2 cache (1 MiB here): memcmp reads what pread wrote
_SMALL_BYTES = 1 << 16
_O_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_local = threading.local()


def same_bytes(path_a: str | os.PathLike[str], path_b: str | os.PathLike[str]) -> int | None:
    """The element count when both single-tensor payloads have equal dtype, shape and bytes; else None."""
    try:
        fd_a = os.open(path_a, _O_FLAGS)
    except OSError:
        return None
    try:
        fd_b = os.open(path_b, _O_FLAGS)
    except OSError:
        os.close(fd_a)
        return None
    try:
        a, b = _layout(fd_a), _layout(fd_b)
        if a is None or b is None or (a.dtype, a.shape, a.nbytes) != (b.dtype, b.shape, b.nbytes):
            return None
        if not _equal_ranges(fd_a, a.start, fd_b, b.start, a.nbytes):
            return None
        numel = 1
        for size in a.shape:
            numel *= size
        return numel
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd_a)
        os.close(fd_b)


def _layout(fd: int) -> PayloadLayout | None:
    """The one tensor of a payload file (``format.payload_layouts`` checks the header); None for any other file."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size < 8:
        return None
    length = int.from_bytes(os.pread(fd, 8, 0), "little")
    layouts = payload_layouts(os.pread(fd, 8 + min(length, PAYLOAD_HEADER_LIMIT), 0), info.st_size)
    return layouts[PAYLOAD_KEY] if list(layouts) == [PAYLOAD_KEY] else None  # decoding refuses other keys


def _buffers() -> tuple[bytearray, bytearray]:
    pair = getattr(_local, "pair", None)
    if pair is None:
        pair = _local.pair = (bytearray(CHUNK_BYTES), bytearray(CHUNK_BYTES))
    return pair


def _equal_ranges(fd_a: int, start_a: int, fd_b: int, start_b: int, nbytes: int) -> bool:
    if nbytes <= _SMALL_BYTES:  # two short reads: no copy and compare of whole chunk buffers for a few KiB
        head = os.pread(fd_a, nbytes, start_a)
        return len(head) == nbytes and head == os.pread(fd_b, nbytes, start_b)
    buf_a, buf_b = _buffers()
    view_a, view_b = memoryview(buf_a), memoryview(buf_b)
    done = 0
    while done < nbytes:
        size = min(CHUNK_BYTES, nbytes - done)
        got_a = _read_exactly(fd_a, view_a[:size], start_a + done)
        got_b = _read_exactly(fd_b, view_b[:size], start_b + done)
        if not got_a or not got_b:
            return False
        if size < CHUNK_BYTES:  # make the unused tails equal: whole-buffer equality is one memcmp
            view_b[size:] = view_a[size:]
        if buf_a != buf_b:
            return False
        done += size
    return True


def _read_exactly(fd: int, view: memoryview, offset: int) -> bool:
    filled = 0
    while filled < len(view):
        got = os.preadv(fd, [view[filled:]], offset + filled)
        if got <= 0:
            return False
        filled += got
    return True


def identical_pair(trace_a: Trace, ra: TensorRecord, trace_b: Trace, rb: TensorRecord) -> PairMetrics | None:
    """The metrics of an identical pair when both payloads are bitwise equal (``same_bytes``); else None."""
    try:
        path_a, path_b = trace_a.payload_path(ra), trace_b.payload_path(rb)
    except TracediffError:
        return None  # decoding reports it
    numel = same_bytes(path_a, path_b)
    return None if numel is None else identical_metrics(numel)
