"""Nothing lost, nothing overwritten: the capture folder lock, overwrite, signals, the journal, file modes."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tracediff
from tests.safety.helpers import capture_small, cli, small, tree_file
from tracediff.errors import OutputDirError

SCRIPT = textwrap.dedent('''
    import os, signal, sys
    import torch
    from torch import nn

    class Dies(nn.Module):
        """Four layers; the third kills its own process in the middle of the forward."""

        def __init__(self, how):
            super().__init__()
            self.how = how
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                if i == 2 and self.how == "SIGKILL":
                    os.kill(os.getpid(), signal.SIGKILL)
                if i == 2 and self.how == "SIGTERM":
                    os.kill(os.getpid(), signal.SIGTERM)
                if i == 2 and self.how == "exit":
                    sys.exit(7)
                x = torch.relu(layer(x))  # an op of Dies's own code, between its submodule calls
                if i == 1 and self.how == "SIGKILL in backward":  # once layers 3 and 2 have their gradients
                    x.register_hook(lambda grad: os.kill(os.getpid(), signal.SIGKILL))
            return x

    def build(how):
        torch.manual_seed(0)
        return Dies(how).eval(), torch.randn(2, 4, generator=torch.Generator().manual_seed(1))

    def killed():
        return build("SIGKILL")

    def killed_in_backward():
        return build("SIGKILL in backward")

    def terminated():
        return build("SIGTERM")

    def exits():
        return build("exit")

    def fine():
        return build("none")
''')


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "dies.py"
    path.write_text(SCRIPT)
    return path


def _capture(script: Path, function: str, out: Path, *options: str, writers: int = 0
             ) -> subprocess.CompletedProcess[str]:
    """A capture in a process of its own. ``writers=0`` by default: with writer threads, a finished call's
    journal line waits for its payloads (docs/trace-format.md, section 8), so what the journal holds when the
    process is killed depends on how many threads the machine gives the writers (cores against torch's
    threads), and the exact calls a test expects would hold on some machines only."""
    return subprocess.run([sys.executable, "-m", "tracediff", "capture", f"{script}:{function}", "--out", str(out),
                           "--writers", str(writers), *options], capture_output=True, text=True, timeout=120)


def test_a_sigkilled_capture_leaves_a_trace_that_show_and_align_read_as_incomplete(
        script: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["capture", f"{script}:fine", "--out", str(tmp_path / "fine")], capsys)[0] == 0
    killed = _capture(script, "killed", tmp_path / "killed")  # the only subprocess: it dies for real
    assert killed.returncode == -signal.SIGKILL
    folder = tmp_path / "killed"
    assert (folder / "tracediff_journal.jsonl").is_file() and not list(folder.glob("*_debug_tree_*.json"))

    trace = tracediff.load_trace(folder)
    assert [n.module_path for n in trace.nodes()] == ["Dies", "Dies.layers.0", "Dies.layers.1"]
    assert trace.roots[0].error == {"type": "CaptureProcessDied",
                                    "message": "the capture process ended inside this call"}
    assert trace.incomplete_reason is not None and "read from its journal" in trace.incomplete_reason

    code, out, _ = cli(["show", str(folder)], capsys)
    assert code == 0 and "INCOMPLETE (the capture process ended before the trace was written" in out.splitlines()[0]
    code, out, _ = cli(["align", str(tmp_path / "fine"), str(folder), "--format", "json"], capsys)
    report = json.loads(out)
    assert code == 1 and report["passed"] is False and report["incomplete_a"] is None
    assert "killed, or out of memory" in report["incomplete_b"]
    assert all(row["status"] == "identical" for row in report["rows"]) and report["rows"]
    code, out, _ = cli(["align", str(tmp_path / "fine"), str(folder)], capsys)
    assert "INCOMPLETE trace B: the capture process ended" in out
    assert "UNDECIDED: the comparison ends where an incomplete trace ends" in out
    assert cli(["align", str(tmp_path / "fine"), str(folder), "--allow-incomplete"], capsys)[0] == 0
    assert tracediff.align(tmp_path / "fine", folder, allow_incomplete=True).passed


def test_a_sigkilled_capture_with_writer_threads_is_readable_and_every_finished_call_complete(
        script: Path, tmp_path: Path) -> None:
    """With writer threads the kill may land before the last lines are written: never a call with a
    payload that is not on disk, whichever calls made it."""
    killed = _capture(script, "killed", tmp_path / "killed", writers=2)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    trace = tracediff.load_trace(tmp_path / "killed")
    assert trace.incomplete_reason is not None and trace.roots[0].module_path == "Dies"
    paths = [n.module_path for n in trace.nodes()]
    assert paths == ["Dies", "Dies.layers.0", "Dies.layers.1"][:len(paths)]
    finished = [n for n in trace.nodes() if n.error is None]
    for node in finished:
        for record in node.tensors:
            assert not record.has_payload or trace.load_payload(record) is not None


def test_a_sigkilled_capture_of_ops_keeps_its_op_nodes_in_their_places(
        script: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["capture", f"{script}:fine", "--out", str(tmp_path / "fine"), "--ops"], capsys)[0] == 0
    killed = _capture(script, "killed", tmp_path / "killed", "--ops")
    assert killed.returncode == -signal.SIGKILL
    trace = tracediff.load_trace(tmp_path / "killed")
    root = trace.roots[0]
    assert [(op.op_index, op.op.rpartition(".")[2]) for op in root.ops] == [(0, "relu"), (1, "relu")]
    assert all(op.tensors for op in root.ops)  # with their inputs and outputs
    # in call order among the submodule calls: layer 0, its relu, layer 1, its relu
    shown = [node.name for node in tracediff.show.show_trace(tmp_path / "killed").nodes if node.depth == 1]
    assert shown == ["layers.0", "#0 torch.relu", "layers.1", "#1 torch.relu"]
    assert [op.op_index for op in root.children[0].ops] == [0]  # each Linear's own F.linear, inside it
    result = tracediff.align(tmp_path / "fine", tmp_path / "killed", allow_incomplete=True)
    relu_rows = [row for row in result.rows if row.op == "torch.relu"]
    assert result.passed and len(relu_rows) == 4 and all(row.status == "identical" for row in relu_rows)


def test_sigterm_writes_the_partial_trace_like_ctrl_c(script: Path, tmp_path: Path) -> None:
    """In a process of its own, as a user's capture receives it: the signal reaches that process alone (in the
    suite's process the native thread pools of the runtimes loaded by earlier tests are there too)."""
    folder = tmp_path / "terminated"
    run = subprocess.run([sys.executable, "-m", "tracediff", "capture", f"{script}:terminated", "--out", str(folder)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 128 + signal.SIGTERM
    assert run.stderr.splitlines()[-1] == (f"tracediff capture: interrupted by received SIGTERM; the partial trace "
                                           f"(marked incomplete) is in {folder}")
    meta = json.loads((folder / "tracediff_metadata.json").read_text())
    assert meta["complete"] is False and meta["error"]["type"] == "CaptureTerminated"
    assert not (folder / "tracediff_journal.jsonl").exists() and not (folder / ".tracediff.lock").exists()
    assert tracediff.load_trace(folder).incomplete_reason.startswith("the forward raised CaptureTerminated")


def test_the_termination_handlers_are_removed_after_a_capture(script: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # what the process had before (under nohup, SIGHUP is ignored): the capture gives back exactly that
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    code, _, _ = cli(["capture", f"{script}:fine", "--out", str(tmp_path / "fine")], capsys)
    assert code == 0
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before


def test_a_model_calling_sys_exit_is_reported_with_the_partial_trace(script: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "exits"
    code, _, err = cli(["capture", f"{script}:exits", "--out", str(folder)], capsys)
    assert code == 2
    assert err == (f"tracediff capture: error: {script}:exits: the forward raised SystemExit(7) in Dies "
                   f"(call 0): 7; the partial trace is in {folder}\n")


def test_an_incomplete_trace_never_passes_silently(tmp_path: Path, small_trace: Path) -> None:
    model = small()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    model.head.register_forward_hook(lambda *_: (_ for _ in ()).throw(ValueError("late failure")))
    with pytest.raises(ValueError), tracediff.capture(model, tmp_path / "raised"):
        model(x, scale=0.5)
    result = tracediff.align(small_trace, tmp_path / "raised")
    assert not result.passed and result.incomplete_b.startswith("the forward raised ValueError in Small")
    assert result.to_dict()["incomplete_b"] == result.incomplete_b and result.to_dict()["allow_incomplete"] is False
    assert tracediff.align(small_trace, tmp_path / "raised", allow_incomplete=True).passed
    assert not tracediff.align(tmp_path / "raised", small_trace).passed


# --- the folder ----------------------------------------------------------------------------------------------


def test_a_folder_locked_by_a_running_capture_is_refused_even_with_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import socket

        (out / ".tracediff.lock").write_text(f"{sleeper.pid} {socket.gethostname()}\n")
        for overwrite in (False, True):
            with pytest.raises(OutputDirError) as e:
                capture_small(out, overwrite=overwrite)
            assert str(e.value) == (f"{out}: another capture (process {sleeper.pid}) is writing into it; "
                                    "wait for it or choose another folder")
    finally:
        sleeper.kill()
        sleeper.wait()
    with pytest.raises(OutputDirError, match="holds a trace left by a capture that did not finish"):
        capture_small(out)  # the lock's process is gone: a stale lock
    capture_small(out, overwrite=True)
    assert not (out / ".tracediff.lock").exists() and tracediff.load_trace(out).incomplete_reason is None


def test_overwrite_removes_only_the_files_the_earlier_trace_lists(tmp_path: Path) -> None:
    out = capture_small(tmp_path / "t")
    earlier = {p.name for p in out.iterdir()}
    (out / "notes.txt").write_text("mine")
    (out / "inputs.safetensors").write_bytes(b"not a payload of the trace")
    stray = out / "rank0"
    stray.symlink_to(tmp_path)  # a link named like a rank folder: never followed
    capture_small(out, overwrite=True, tensors="summary")  # writes no payloads: every earlier one must be gone
    left = {p.name for p in out.iterdir()}
    assert left == {"notes.txt", "inputs.safetensors", "rank0", "Small_debug_tree_FULL_TENSORS.json",
                    "Small_debug_tree_SUMMARY.json", "tracediff_metadata.json"}
    assert earlier - left == {p for p in earlier if p.endswith(".safetensors")}


def test_save_inputs_inside_the_output_folder_is_kept(script: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    inputs = out / "inputs.safetensors"
    assert cli(["capture", f"{script}:fine", "--out", str(out), "--save-inputs", str(inputs)], capsys)[0] == 0
    assert inputs.is_file()
    code, _, err = cli(["capture", f"{script}:fine", "--out", str(out), "--inputs", str(inputs), "--overwrite"],
                       capsys)
    assert code == 0, err
    assert inputs.is_file()


def test_inputs_that_are_not_regular_files_are_named_as_such(script: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code, _, err = cli(["capture", f"{script}:fine", "--out", str(tmp_path / "o"), "--inputs", str(fifo)], capsys)
    assert code == 2 and err.endswith(f"{fifo}: the inputs file is a FIFO, not a regular file; refused\n")
    code, _, err = cli(["capture", f"{script}:fine", "--out", str(tmp_path / "o"), "--inputs", "/dev/zero"], capsys)
    assert code == 2 and err.endswith("/dev/zero: the inputs file is a device, not a regular file; refused\n")
    assert not (tmp_path / "o").exists()  # the folder taken for the capture is given back


# --- files written -------------------------------------------------------------------------------------------


def test_traces_and_reports_are_written_0644_under_umask_022(tmp_path: Path, small_trace: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    old = os.umask(0o022)
    try:
        out = capture_small(tmp_path / "t")
        report = tmp_path / "report.json"
        assert cli(["align", str(small_trace), str(out), "--format", "json", "-o", str(report)], capsys)[0] == 0
    finally:
        os.umask(old)
    for path in [*out.iterdir(), report]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def test_a_planted_temporary_file_link_is_never_followed(tmp_path: Path) -> None:
    from tracediff.files.payloads import write_tensor_file

    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "x.safetensors"
    (tmp_path / "x.safetensors.tmp").symlink_to(victim)
    write_tensor_file(target, torch.ones(2))
    assert victim.read_text() == "precious" and target.is_file() and not target.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim", "x.safetensors", "x.safetensors.tmp"]


def test_output_targets_keep_what_they_are(tmp_path: Path, small_trace: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    real = tmp_path / "real.json"
    real.write_text("old")
    real.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert cli(["show", str(small_trace), "--format", "json", "-o", str(link)], capsys)[0] == 0
    assert link.is_symlink() and json.loads(real.read_text())["model_name"] == "Small"
    assert stat.S_IMODE(real.stat().st_mode) == 0o600
    assert cli(["show", str(small_trace), "-o", "/dev/null"], capsys)[0] == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    code, _, err = cli(["show", str(small_trace), "-o", str(tmp_path)], capsys)
    assert code == 2 and err == f"tracediff show: error: {tmp_path}: is a directory; give a file name\n"


def test_capture_into_a_read_only_folder_or_under_a_file_is_one_line(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    code, _, err = cli(["demo", "--out", str(a_file / "demo")], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "ro"
        locked.mkdir()
        locked.chmod(0o500)
        code, _, err = cli(["demo", "--out", str(locked / "demo")], capsys)
        assert code == 2 and err.count("\n") == 1
    assert tree_file  # the helpers stay importable


def test_a_capture_killed_in_backward_keeps_the_gradients_recorded_so_far(script: Path, tmp_path: Path) -> None:
    folder = tmp_path / "killed"
    killed = _capture(script, "killed_in_backward", folder, "--backward")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    trace = tracediff.load_trace(folder)
    assert trace.incomplete_reason is not None
    assert [n.module_path for n in trace.roots[0].walk()] == ["Dies", *(f"Dies.layers.{i}" for i in range(4))]
    done = {n.module_path: [t.slot for t in n.tensors] for n in trace.backward}
    # gradients reached the last two layers, which produced their input gradients, before the process died
    assert done["Dies.layers.3"] == ["grad_outputs.0", "grad_inputs.0"]
    assert done["Dies.layers.2"] == ["grad_outputs.0", "grad_inputs.0"]
    assert "Dies.layers.0" not in done
    assert all(t.has_payload for n in trace.backward for t in n.tensors)


def test_journal_op_lines_are_placed_by_position_even_when_written_late(tmp_path: Path) -> None:
    """With writer threads an op's line waits for its payloads: it may follow the next call's line."""
    tensor = {"shape": "torch.Size([2])", "dtype": "torch.float32", "stats": {"numel": 2, "mean": 0.5}}
    op = {"module_path": "M", "call_index": 0, "op": "torch.relu", "op_index": 0,
          "inputs": {"args": [tensor]}, "outputs": tensor}
    lines = [{"enter": 0, "parent": None, "module_path": "M", "call_index": 0, "module_type": "M"},
             {"enter": 1, "parent": 0, "module_path": "M.a", "call_index": 0, "module_type": "Linear"},
             {"exit": 1, "node": {"module_path": "M.a", "call_index": 0, "outputs": tensor}},
             {"enter": 2, "parent": 0, "module_path": "M.b", "call_index": 0, "module_type": "Linear"},
             {"op_in": 0, "at": 1, "node": op},  # ran between M.a and M.b
             {"op_in": 7, "at": 0, "node": op},  # a call the journal never started: ignored
             {"exit": 2, "node": {"module_path": "M.b", "call_index": 0, "outputs": tensor}}]
    (tmp_path / "tracediff_journal.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    names = [node.name for node in tracediff.show.show_trace(tmp_path).nodes]
    assert names == ["M", "a", "#0 torch.relu", "b"]
