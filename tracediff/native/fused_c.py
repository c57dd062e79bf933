"""The comparison's one pass (and a tensor's statistics in one pass) built from ``fused_pass.c`` with the
machine's C compiler, loaded through ctypes.

Why C beside numba (``fused.py``): loading numba's build costs about 0.7 s of every fresh ``tracediff align``
(numba's import, scipy's, the first call linking the cached code), more than comparing a 1 GB pair takes;
a shared library built once loads in about a millisecond. It is built on first use by ``$CC`` (else ``cc``)
with the flags below, in a second or so, and kept in ``$XDG_CACHE_HOME/tracediff`` (else
``~/.cache/tracediff``) under a name made of the hash of the source, the flags, the compiler and the
machine, so that a changed source, compiler or CPU builds anew. Where no compiler is found (or the build
fails) numba's build is used, else numpy (:mod:`tracediff.compare.kernel` decides).

Only what this user wrote is loaded: the folder and the library must be owned by the user and writable by
no one else; the library is written under a temporary name and renamed into place, so that a process never
loads a half-written file. Every call checks the arrays' dtypes, layout and sizes before C reads them.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .fused_columns import BLOCK, COLUMNS, STATS_COLUMNS

SOURCE = Path(__file__).with_name("fused_pass.c")
# strict IEEE arithmetic: no fused multiply-add, no reordering (fused_pass.c frees the order of its two summing
# functions alone, by pragma); math-errno and trapping only concern errno and floating-point exception flags,
# which nothing reads
FLAGS = ("-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared")
BUILD_SECONDS = 120  # a compiler that hangs leaves the comparison to numba or numpy
_ARGS = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
         ctypes.c_int32, ctypes.c_double, ctypes.c_double, ctypes.c_double, ctypes.c_int64, ctypes.c_int64,
         ctypes.c_void_p, ctypes.c_void_p]


def compiler() -> list[str] | None:
    """The C compiler's command (``$CC``, else ``cc``), or None where none is found or this is not POSIX."""
    if os.name != "posix":
        return None
    command = shlex.split(os.environ.get("CC") or "cc")
    found = shutil.which(command[0]) if command else None
    return [found, *command[1:]] if found else None


def folder() -> Path:
    """Where the built library is kept."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tracediff"


def cpu() -> tuple[tuple[str, ...], str]:
    """The flags that build for this CPU, and what names the CPU in the library's name: on Linux x86-64, the
    instruction sets it has (``/proc/cpuinfo``'s flags) with ``-march=native`` (the float-to-double and 64-bit
    integer lanes of AVX2 make the pass vectorize: 2.3 GB/s against 0.8 with SSE2 alone, on one core);
    elsewhere the compiler's default target. A home folder shared by machines of other CPUs then holds one
    library per CPU, never one built for another."""
    if sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64"):
        try:
            with open("/proc/cpuinfo", "rb") as info:
                head = info.read(1 << 16)
        except OSError:
            return (), ""
        for line in head.splitlines():
            if line.startswith(b"flags"):
                return ("-march=native",), hashlib.sha256(line).hexdigest()
    return (), ""


def library(command: list[str], target: str) -> Path:
    """The library's path for this source, these flags, this compiler (its file, size and time), machine and
    CPU."""
    real = os.path.realpath(command[0])
    made = os.stat(real)
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), repr((FLAGS, command, real, made.st_size, made.st_mtime_ns)).encode(),
                 platform.machine().encode(), sys.platform.encode(), target.encode()):
        digest.update(part)
        digest.update(b"\0")
    return folder() / f"fused-pass-{digest.hexdigest()[:24]}.so"


def _private(path: Path, kind: int) -> bool:
    """``path`` is a ``kind`` (directory or regular file) owned by this user and writable by no one else."""
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return stat.S_IFMT(found.st_mode) == kind and found.st_uid == os.getuid() and not found.st_mode & 0o022


def _build_plan() -> tuple[list[str], tuple[str, ...], Path] | None:
    """The compiler's command, the CPU's flags and the library's path, or None without a compiler (or when
    the source or the compiler went missing)."""
    command = compiler()
    if command is None:
        return None
    native, target = cpu()
    try:
        return command, native, library(command, target)
    except OSError:
        return None


def _loaded(path: Path) -> Callable[..., int] | None:
    """The pass from ``path`` if it is a library of this user's that no one else could have written."""
    if not (_private(path.parent, stat.S_IFDIR) and _private(path, stat.S_IFREG)):
        return None
    return _opened(path)


def cached() -> Callable[..., int] | None:
    """The pass from a library already built for this machine, or None (nothing is built here)."""
    plan = _build_plan()
    return None if plan is None else _loaded(plan[2])


def load() -> Callable[..., int] | None:
    """The pass, built now if it is not cached; None without a compiler or when the build fails."""
    plan = _build_plan()
    if plan is None:
        return None
    command, native, path = plan
    found = _loaded(path)
    if found is not None:
        return found
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    if not _private(path.parent, stat.S_IFDIR):
        return None
    temporary = ""
    try:
        handle, temporary = tempfile.mkstemp(prefix=".building-", suffix=".so", dir=path.parent)
        os.close(handle)
        done = subprocess.run([*command, *FLAGS, *native, "-o", temporary, str(SOURCE)], capture_output=True,
                              timeout=BUILD_SECONDS, check=False, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            return None
        os.chmod(temporary, 0o755)
        os.replace(temporary, path)
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        if temporary and os.path.exists(temporary):
            os.unlink(temporary)
    return _opened(path)


def _opened(path: Path) -> Callable[..., int] | None:
    try:
        lib = ctypes.CDLL(str(path))
        if lib.td_fused_columns() != COLUMNS or lib.td_stats_columns() != STATS_COLUMNS:  # another layout
            return None
        return _Pass(lib)
    except (OSError, AttributeError):
        return None


class _Pass:
    """``fused.fused_pass``'s call, on the C library: checks what it is given, then runs without the GIL
    (ctypes releases it for the call)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.passes = {}
        self.statistics = {}
        for suffix, width in (("f32", np.float32), ("f64", np.float64)):
            function = getattr(lib, f"td_fused_pass_{suffix}")
            function.restype = ctypes.c_int64
            function.argtypes = _ARGS
            self.passes[np.dtype(width)] = function
            measure = getattr(lib, f"td_stats_{suffix}")
            measure.restype = ctypes.c_int64
            measure.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
            self.statistics[np.dtype(width)] = measure

    def stats(self, values: np.ndarray, chunk: int) -> np.ndarray:
        """The statistics of ``values`` (1-D, native float32 or float64, contiguous, not empty), one row per
        chunk of ``chunk`` elements in ``capturing/stats.py``'s ``wide_partials`` layout: finite minimum and
        maximum, the sum, the sum of squares, the sum of magnitudes and the non-zeros of the finite elements,
        the finite, NaN and +Inf counts."""
        function = self.statistics.get(values.dtype) if values.dtype.isnative else None
        if function is None or values.ndim != 1 or not values.flags.c_contiguous or values.size == 0 or chunk < 1:
            raise ValueError("the compiled statistics take one non-empty contiguous 1-D float32 or float64 array")
        out = np.empty((-(-values.size // chunk), STATS_COLUMNS), dtype=np.float64)
        function(values.ctypes.data, values.size, chunk, BLOCK, out.ctypes.data)
        return out

    def __call__(self, a: np.ndarray, b: np.ndarray, flat: int, chunk: int, block: int, narrow: bool,
                 atol: float, rtol: float, max_rel: float, inner: int, length: int, hit: np.ndarray,
                 out: np.ndarray) -> int:
        function = self.passes.get(a.dtype) if a.dtype.isnative else None
        if function is None or b.dtype != a.dtype or a.shape != b.shape or a.ndim != 1:
            raise ValueError("the compiled pass takes two 1-D arrays of one native float32 or float64 dtype")
        if not (a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable
                and hit.flags.c_contiguous and hit.flags.writeable):
            raise ValueError("the compiled pass takes contiguous arrays and writable outputs")
        if chunk < 1 or block < 1 or inner < 1 or length < 0 or flat < 0:
            raise ValueError("the compiled pass takes positive chunk, block and inner sizes")
        if out.dtype != np.float64 or out.ndim != 2 or out.shape[1] != COLUMNS or out.shape[0] < -(-a.size // chunk):
            raise ValueError(f"the compiled pass writes one row of {COLUMNS} float64 per chunk")
        if hit.dtype != np.bool_ or hit.size < length:
            raise ValueError("the compiled pass marks one bool per position")
        return int(function(a.ctypes.data, b.ctypes.data, a.size, flat, chunk, block, int(narrow), atol, rtol,
                            max_rel, inner, length, hit.ctypes.data, out.ctypes.data))


__all__ = ["BUILD_SECONDS", "FLAGS", "SOURCE", "cached", "compiler", "cpu", "folder", "library", "load"]
