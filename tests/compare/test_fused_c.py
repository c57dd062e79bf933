"""The C build of the comparison's pass (tracediff/native/fused_c.py): built once per source, compiler and CPU
into a private cache, loaded from there in a fresh process without numba, never loaded from a file someone
else could have written, and never handed arrays it would read out of bounds. That its rows are numpy's is
tests/compare/test_kernel.py's (every case runs on both builds)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tracediff.compare import kernel
from tracediff.native import fused_c
from tracediff.native.fused_columns import COLUMNS, FINITE, MAX_ABS

pytestmark = pytest.mark.skipif(fused_c.compiler() is None, reason="no C compiler")


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty cache folder of the test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "tracediff"


def _library() -> Path:
    command = fused_c.compiler()
    assert command is not None
    return fused_c.library(command, fused_c.cpu()[1])


def test_built_once_then_loaded_from_the_cache(cache: Path) -> None:
    assert fused_c.cached() is None  # nothing built: cached() never builds
    assert fused_c.load() is not None
    built = _library()
    assert built.is_file() and built.parent == cache
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    assert [p.name for p in cache.iterdir()] == [built.name]  # the temporary file was renamed into place
    stamp = built.stat().st_mtime_ns
    assert fused_c.cached() is not None and fused_c.load() is not None
    assert built.stat().st_mtime_ns == stamp  # loaded, not built again


def test_another_source_flags_or_cpu_builds_another_library(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    command = fused_c.compiler()
    assert command is not None
    first = fused_c.library(command, "cpu one")
    assert fused_c.library(command, "cpu two") != first
    monkeypatch.setattr(fused_c, "FLAGS", (*fused_c.FLAGS, "-DTD_OTHER"))
    assert fused_c.library(command, "cpu one") != first


@pytest.mark.parametrize("mode", [0o775, 0o757])
def test_a_library_others_could_write_is_never_loaded(cache: Path, mode: int) -> None:
    assert fused_c.load() is not None
    os.chmod(_library(), mode)
    assert fused_c.cached() is None
    os.chmod(_library(), 0o755)
    os.chmod(cache, mode)
    assert fused_c.cached() is None


def test_a_link_in_place_of_the_library_is_never_loaded(cache: Path, tmp_path: Path) -> None:
    assert fused_c.load() is not None
    built = _library()
    elsewhere = tmp_path / "elsewhere.so"
    built.rename(elsewhere)
    built.symlink_to(elsewhere)
    assert fused_c.cached() is None


def test_a_broken_compiler_leaves_the_comparison_to_numba_or_numpy(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\necho 'cc: broken' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    assert fused_c.load() is None
    assert not [p for p in cache.iterdir() if p.suffix == ".so"]  # nothing half-built left behind
    monkeypatch.setattr(kernel, "_state", kernel._State())
    monkeypatch.setenv(kernel.VARIABLE, "c")  # only the C build: none, so numpy compares
    assert kernel.load() is None and not kernel.enabled()


def test_no_compiler_at_all(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-anywhere")
    assert fused_c.compiler() is None and fused_c.load() is None and fused_c.cached() is None


def _arguments(n: int = 4096, chunk: int = 1024) -> dict[str, object]:
    a = np.linspace(-1, 1, n, dtype=np.float32)
    return {"a": a, "b": a + np.float32(1e-3), "flat": 0, "chunk": chunk, "block": 256, "narrow": True,
            "atol": 1e-5, "rtol": 0.0, "max_rel": 0.0, "inner": 64, "length": n // 64,
            "hit": np.zeros(n // 64, np.bool_), "out": np.empty((-(-n // chunk), COLUMNS))}


def test_the_pass_fills_one_row_per_chunk_and_marks_positions(cache: Path) -> None:
    run = fused_c.load()
    assert run is not None
    given = _arguments()
    assert run(*given.values()) == 4
    out, hit = given["out"], given["hit"]
    assert isinstance(out, np.ndarray) and isinstance(hit, np.ndarray)
    assert out[:, FINITE].tolist() == [1024.0] * 4 and hit.all()
    assert out[-1, MAX_ABS] == pytest.approx(1e-3, rel=1e-3)


@pytest.mark.parametrize("change", [
    {"out": np.empty((3, COLUMNS))},  # fewer rows than chunks
    {"out": np.empty((4, COLUMNS - 1))},
    {"out": np.empty((4, COLUMNS), np.float32)},
    {"hit": np.zeros(10, np.bool_)},  # fewer flags than positions
    {"hit": np.zeros(64, np.uint8)},
    {"b": np.zeros(4095, np.float32)},
    {"b": np.zeros(4096, np.float64)},
    {"a": np.zeros(8192, np.float32)[::2]},  # not contiguous
    {"a": np.zeros(4096, ">f4"), "b": np.zeros(4096, ">f4")},  # another byte order
    {"a": np.zeros(4096, np.int32), "b": np.zeros(4096, np.int32)},
    {"chunk": 0},
    {"inner": 0},
])
def test_arrays_the_pass_would_misread_are_refused(cache: Path, change: dict[str, object]) -> None:
    run = fused_c.load()
    assert run is not None
    given = _arguments() | change
    with pytest.raises(ValueError, match="the compiled pass"):
        run(*given.values())


def test_a_fresh_process_takes_the_cached_build_at_once_without_numba(tmp_path: Path) -> None:
    """Once built, a new process compares its first large pair with the C build (no threshold of bytes, no
    background load) and never imports numba."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    env.pop(kernel.VARIABLE, None)
    script = (
        "import sys, numpy as np\n"
        "from tracediff.compare import kernel\n"
        "from tracediff.native import fused_c\n"
        "from tracediff.compare.metrics import measure_tensors\n"
        "from tracediff.trace.payload import Payload\n"
        "if sys.argv[1] == 'build':\n"
        "    assert fused_c.load() is not None\n"
        "    raise SystemExit(0)\n"
        "a = np.linspace(0, 1, 1 << 16, dtype=np.float32)\n"
        "pair = Payload(a, 'float32'), Payload(a + np.float32(1e-3), 'float32')\n"
        "assert kernel.wanted(*pair)\n"
        "found = measure_tensors(a, a + np.float32(1e-3), atol=1e-5, rtol=0.0)\n"
        "assert found[0].mismatched == a.size\n"
        "print(type(kernel._state.kernel).__name__, 'numba' in sys.modules)\n")
    for step in ("build", "use"):
        done = subprocess.run([sys.executable, "-c", script, step], env=env, capture_output=True, text=True,
                              check=True)
    assert done.stdout.split() == ["_Pass", "False"]
