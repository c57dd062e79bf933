"""Mutation fuzzing of traces: whatever a trace folder holds, ``show`` and ``align`` keep their promises.

Each example copies a valid trace, applies one to three mutations (a JSON
value replaced by a hostile one, a key deleted, a file truncated, payload
bytes flipped, a file replaced by a directory, a FIFO, a symbolic link loop,
a link out of the folder or to ``/dev/zero``) and runs ``tracediff align``
and ``tracediff show`` in-process with ``--format json``. Asserted: exit code
0, 1 or 2 (never 3, never an uncaught exception), no traceback, one line on
stderr for exit 2, strict JSON on stdout otherwise, ``passed`` agreeing with
the exit code, and at most ``RUN_SECONDS`` per run (an alarm interrupts a hang).

The budget is set for CI (derandomized, ``FUZZ_EXAMPLES`` examples); run it
longer by hand with ``FUZZ_EXAMPLES=5000 HYPOTHESIS_PROFILE=explore``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.safety.helpers import cli, copy, tree_file

FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
RUN_SECONDS = 20
HUGE_INT = "1" + "0" * 5000  # over Python's 4,300-digit limit for int()
HOSTILE_VALUES: list[Any] = [
    None, 0, -1, 1.5, True, "", "x", "\x1b[2J\x1b]0;pwned\x07", "\udc80", "<script>alert(1)</script>", [], {},
    [1, 2, 3], {"a": 1}, float("nan"), float("inf"), -float("inf"), 2 ** 70, "torch.Size([" + "9" * 400 + "])",
    "./", ".", "../outside.safetensors", "/etc/passwd", "a\0b", {"py_type": "int", "py_value": 3},
    {"shape": "torch.Size([2])", "dtype": "torch.float32", "value": 7}, "__HUGE_INT__", "__DEEP__",
]


class RunTimeout(BaseException):
    """One CLI run took longer than RUN_SECONDS (a hang)."""


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def on_alarm(_signum: int, _frame: Any) -> None:
        raise RunTimeout(f"run exceeded {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _positions(value: Any, out: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                out.append((item, key))
                stack.append(child)
        elif isinstance(item, list):
            for i, child in enumerate(item):
                out.append((item, i))
                stack.append(child)
    return out


def _dump(tree: Any) -> str:
    text = json.dumps(tree)
    text = text.replace('"__HUGE_INT__"', HUGE_INT)
    return text.replace('"__DEEP__"', "[" * 5000 + "]" * 5000)


def mutate_json(path: Path, data: st.DataObject) -> None:
    try:
        tree = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # an earlier mutation made it unreadable: leave it so
        return
    positions = _positions(tree, [])
    kind = data.draw(st.sampled_from(["replace", "delete", "truncate", "replace", "top"]))
    if kind == "top":
        tree = data.draw(st.sampled_from(HOSTILE_VALUES))
    elif kind == "truncate":
        text = path.read_text()
        path.write_text(text[: data.draw(st.integers(0, max(len(text) - 1, 0)))])
        return
    elif positions:
        container, key = positions[data.draw(st.integers(0, len(positions) - 1))]
        if kind == "delete":
            del container[key]
        else:
            container[key] = data.draw(st.sampled_from(HOSTILE_VALUES))
    path.write_text(_dump(tree))


def mutate_file_kind(path: Path, outside: Path, data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["directory", "fifo", "loop", "outside", "zero", "empty", "flip", "truncate"]))
    if kind in ("flip", "truncate"):
        if not path.is_file() or path.is_symlink():
            return  # a FIFO made by an earlier mutation: opening it to write would wait for a reader
        raw = bytearray(path.read_bytes())
        if raw:
            at = data.draw(st.integers(0, len(raw) - 1))
            if kind == "flip":
                raw[at] ^= data.draw(st.integers(1, 255))
            else:
                del raw[at:]
        path.write_bytes(bytes(raw))
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "outside":
        path.symlink_to(outside)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(b"")


def _strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"non-strict JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def check_run(argv: list[str], capsys: Any) -> None:
    with time_limit(RUN_SECONDS):
        code, out, err = cli(argv, capsys)
    if os.environ.get("FUZZ_VERBOSE"):  # for runs by hand: which outcomes the mutations reach
        print(f"fuzz: {argv[0]} exit {code}: {err.strip()[:160]}", file=sys.__stderr__)
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err, err
    if code == 2:
        assert err.count("\n") == 1 and err.startswith(f"tracediff {argv[0]}: error: "), err
        return
    report = _strict_json(out)
    if argv[0] == "align":
        assert report["passed"] is (code == 0), (code, report["passed"])


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory: pytest.TempPathFactory, small_trace: Path) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "outside.safetensors").write_bytes((small_trace / next(
        p.name for p in small_trace.iterdir() if p.suffix == ".safetensors")).read_bytes())
    return root


@settings(max_examples=FUZZ_EXAMPLES, suppress_health_check=list(HealthCheck), deadline=None)
@given(data=st.data())
def test_mutated_traces_keep_every_promise(data: st.DataObject, small_trace: Path, fuzz_root: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    work = fuzz_root / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    a, b = copy(small_trace, work / "a"), copy(small_trace, work / "b")
    target = data.draw(st.sampled_from([a, b, b, b]))
    names = sorted(p.name for p in target.iterdir())
    for _ in range(data.draw(st.integers(1, 3))):
        present = sorted(p.name for p in target.iterdir()) or names
        json_files = [n for n in present if n.endswith(".json")]
        # half of the mutations go to the few JSON files, half to the many payloads
        name = data.draw(st.sampled_from(json_files if json_files and data.draw(st.booleans()) else present))
        path = target / name
        if name.endswith(".json") and path.is_file() and not path.is_symlink() and data.draw(st.integers(0, 3)):
            mutate_json(path, data)
        else:
            mutate_file_kind(path, fuzz_root / "outside.safetensors", data)
    check_run(["align", str(a), str(b), "--format", "json"], capsys)
    check_run(["show", str(target), "--format", "json"], capsys)
    if data.draw(st.booleans()):
        check_run(["align", str(a), str(b), "--format", "json", "--allow-incomplete"], capsys)


def test_the_fuzzer_mutates_for_real(small_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The harness itself: a tree JSON replaced by a FIFO is refused (exit 2), not hung on."""
    b = copy(small_trace, tmp_path / "b")
    json_file = tree_file(b)
    json_file.unlink()
    os.mkfifo(json_file)
    with time_limit(RUN_SECONDS):
        code, _, err = cli(["align", str(small_trace), str(b)], capsys)
    assert code == 2 and f"{json_file}: the trace JSON is a FIFO, not a regular file; refused" in err
