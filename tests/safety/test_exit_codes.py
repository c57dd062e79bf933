"""The four exit codes: 0 passed, 1 diverged and nothing else, 2 bad input, 3 internal error."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tracediff.show
from tests.safety.helpers import cli
from tracediff.cli.exit_codes import EXIT_CODES
from tracediff.cli.main import build_parser


def _boom(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("boom\nsecond line")


def test_an_internal_error_exits_3_with_one_line(monkeypatch: pytest.MonkeyPatch, small_trace: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(tracediff.show, "show_trace", _boom)
    monkeypatch.delenv("TRACEDIFF_DEBUG", raising=False)
    code, out, err = cli(["show", str(small_trace)], capsys)
    assert code == 3 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("tracediff show: internal error: RuntimeError: boom second line (at test_exit_codes.py:")
    assert err.endswith("; please report it with the command (run with --debug for the traceback)\n")


@pytest.mark.parametrize("how", [["--debug", "show"], ["show", "--debug"], "env"])
def test_debug_prints_the_traceback(how: Any, monkeypatch: pytest.MonkeyPatch, small_trace: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(tracediff.show, "show_trace", _boom)
    argv = ["show", str(small_trace)] if how == "env" else [*how, str(small_trace)]
    if how == "env":
        monkeypatch.setenv("TRACEDIFF_DEBUG", "1")
    code, _, err = cli(argv, capsys)
    assert code == 3
    assert err.startswith("Traceback (most recent call last):") and "RuntimeError: boom" in err
    assert err.splitlines()[-1].endswith("; please report it with the command")


def test_a_divergence_is_the_only_exit_1(tmp_path: Path, small_trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.safety.helpers import capture_small

    other = capture_small(tmp_path / "other", seed=1)
    assert cli(["align", str(small_trace), str(small_trace)], capsys)[0] == 0
    assert cli(["align", str(small_trace), str(other)], capsys)[0] == 1
    code, _, err = cli(["align", str(small_trace), str(tmp_path / "missing")], capsys)
    assert code == 2 and err == f"tracediff align: error: {tmp_path / 'missing'}: no such trace folder or file\n"


def test_every_command_documents_the_four_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices  # type: ignore[union-attr]
    assert set(commands) >= {"demo", "capture", "show", "align", "plot", "steps"}
    for name, command in commands.items():
        text = command.format_help()
        assert "exit codes:\n  0  " in text and EXIT_CODES in text, name
        assert "--debug" in text, name
    assert EXIT_CODES in parser.format_help()


def test_help_and_debug_flag_do_not_import_torch() -> None:
    code = ("import sys; from tracediff.cli.main import build_parser; build_parser().format_help(); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- leaving without the interpreter's teardown --------------------------------------------------------------


class _Left(Exception):
    def __init__(self, how: str, code: int) -> None:
        super().__init__(how, code)
        self.how, self.code = how, code


def _watch_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracediff.cli import process

    def fast(code: int) -> None:
        raise _Left("os._exit", code)

    def usual(code: int) -> None:
        raise _Left("sys.exit", code)

    monkeypatch.setattr(process.os, "_exit", fast)
    monkeypatch.setattr(process.sys, "exit", usual)


def test_the_command_line_ends_at_once_when_nothing_else_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracediff.cli import process

    _watch_exits(monkeypatch)
    monkeypatch.setattr(process.threading, "active_count", lambda: 1)  # whatever threads the test runner keeps
    with pytest.raises(_Left) as left:
        process.leave(1)
    assert (left.value.how, left.value.code) == ("os._exit", 1)


def test_the_command_line_exits_the_usual_way_while_a_thread_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from tracediff.cli.process import leave

    _watch_exits(monkeypatch)
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        with pytest.raises(_Left) as left:
            leave(0)
    finally:
        release.set()
        worker.join()
    assert (left.value.how, left.value.code) == ("sys.exit", 0)


def test_output_to_a_pipe_is_whole_when_the_process_ends(small_trace: Path) -> None:
    """stdout to a pipe is block-buffered: a short report sits in the buffer until it is flushed, which must
    happen before the process ends without its teardown."""
    buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, "-m", "tracediff", "show", str(small_trace), "--depth", "0"],
                          capture_output=True, text=True, check=False, env=buffered)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("Small: tracediff trace at ") and done.stdout.endswith("\n")
    assert len(done.stdout) < 8192  # shorter than the buffer: nothing was written before the flush


def test_only_commands_that_run_no_code_of_the_users_skip_the_teardown(
        monkeypatch: pytest.MonkeyPatch, small_trace: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An ``atexit`` handler of the user's model (capture, replay) must still run: those exit the usual way."""
    from tracediff.cli import main as cli_main
    from tracediff.cli import process

    commands = next(a for a in build_parser()._actions if a.dest == "command").choices  # type: ignore[union-attr]
    assert {name for name, p in commands.items() if p.get_default("skip_teardown")} == \
        {"show", "align", "steps", "plot"}
    _watch_exits(monkeypatch)
    monkeypatch.setattr(process.threading, "active_count", lambda: 1)
    assert gc.isenabled()
    for argv, how, code in ((["show", str(small_trace), "--depth", "0"], "os._exit", 0),
                            (["replay", str(tmp_path / "missing"), "model.py:build"], "sys.exit", 2)):
        monkeypatch.setattr(sys, "argv", ["tracediff", *argv])
        try:
            with pytest.raises(_Left) as left:
                cli_main.entry_point()
            # the process ends with the command: the collector stays off for a command that skips the teardown
            assert gc.isenabled() is (how == "sys.exit"), argv
        finally:
            gc.enable()
        assert (left.value.how, left.value.code) == (how, code), argv
    cli_main.main(["show", str(small_trace), "--depth", "0"])  # main() is a library call: the collector stays on
    assert gc.isenabled()
    capsys.readouterr()
