"""The payload pipeline: writer threads and a bounded pool write what the synchronous path writes."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff
from tests.capturing.helpers import DiskFillsUp, files, find, metadata, payload, trace_json
from tests.models import SharedLoop, seeded, tiny_llama, toy_input
from tracediff.capturing import pipeline as pipeline_module
from tracediff.capturing.pipeline import HostPool, PayloadPipeline
from tracediff.errors import OutputDirError, UsageError
from tracediff.files.payloads import read_tensor_file, write_tensor_file


def _capture(model: nn.Module, inputs: dict[str, torch.Tensor], out: Path, **options: object) -> object:
    with torch.no_grad(), tracediff.capture(model, out, **options) as session:  # type: ignore[arg-type]
        model(**inputs)
    return session


def _bytes_of(folder: Path) -> dict[str, bytes]:
    """Every file of a trace but the metadata (it holds the time and the options)."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "tracediff_metadata.json"}


@pytest.mark.parametrize("writers,pool_mb", [(2, 256), (1, 1), (3, 0)])
def test_the_pipeline_writes_exactly_the_files_of_the_synchronous_path(
    tmp_path: Path, writers: int, pool_mb: int
) -> None:
    model, inputs = tiny_llama(layers=2)
    _capture(model, inputs, tmp_path / "sync", writers=0)
    session = _capture(model, inputs, tmp_path / "pipe", writers=writers, pool_mb=pool_mb)
    expected, got = _bytes_of(tmp_path / "sync"), _bytes_of(tmp_path / "pipe")
    assert sorted(got) == sorted(expected) and len(got) > 40
    assert [name for name in expected if got[name] != expected[name]] == []  # payloads and trees, byte for byte
    meta = metadata(tmp_path / "pipe")
    assert meta["complete"] is True and meta["payload_files"] == session.files == len(got) - 2  # type: ignore[attr-defined]
    assert meta["payload_bytes"] == metadata(tmp_path / "sync")["payload_bytes"]
    stated = meta["options"]["payload_pipeline"]
    assert stated["writers"] == writers and stated["pool_bytes"] == pool_mb << 20
    assert stated["peak_pool_bytes"] <= stated["pool_bytes"]


def test_the_pool_size_is_stated_and_summary_capture_has_no_pipeline(tmp_path: Path) -> None:
    model, inputs = tiny_llama(layers=1)
    _capture(model, inputs, tmp_path / "full")
    _capture(model, inputs, tmp_path / "summary", tensors="summary")
    stated = metadata(tmp_path / "full")["options"]["payload_pipeline"]
    assert stated["pool_bytes"] == 256 << 20 and stated["writers"] == pipeline_module.default_writers()
    assert metadata(tmp_path / "summary")["options"]["payload_pipeline"] is None


class ModifiesRecorded(nn.Module):
    """The parent doubles its child's output in place after the child returned (and was recorded)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        y.mul_(2.0)
        y.add_(1.0)
        return y


class GatedWrites:
    """A write function that holds every payload until ``open()``: writers lag far behind the forward."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.real = pipeline_module.write_tensor_file

    def __call__(self, path: Path, tensor: torch.Tensor) -> int:
        self.gate.wait(10)
        return self.real(path, tensor)


def test_a_tensor_changed_in_place_after_it_was_recorded_keeps_its_recorded_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, x = seeded(ModifiesRecorded), toy_input()
    recorded = model.inner(x).detach().clone()
    gated = GatedWrites()
    monkeypatch.setattr(pipeline_module, "write_tensor_file", gated)
    with torch.no_grad(), tracediff.capture(model, tmp_path, writers=2) as session:
        out = model(x)
        assert session.files == 0  # nothing written yet: every payload waits in the pool
        gated.gate.set()
    tree = trace_json(tmp_path)
    (inner,) = find(tree, "ModifiesRecorded.inner")
    assert torch.equal(payload(tmp_path, inner["outputs"]), recorded)
    assert torch.equal(payload(tmp_path, tree["outputs"]), out)  # the same object, recorded again once changed
    assert inner["outputs"]["stats"]["max"] == pytest.approx(float(recorded.max()))


def test_a_tiny_pool_bounds_memory_and_makes_the_forward_wait(tmp_path: Path) -> None:
    tensors = [torch.full((64, 256), float(i)) for i in range(12)]  # 64 KiB each
    slow_calls: list[float] = []

    def slow_write(path: Path, tensor: torch.Tensor) -> int:
        time.sleep(0.01)
        slow_calls.append(time.perf_counter())
        return pipeline_module.write_tensor_file(path, tensor)

    pipe = PayloadPipeline(writers=2, pool_bytes=3 << 16, write=slow_write)
    for i, t in enumerate(tensors):
        assert pipe.submit(tmp_path / f"{i}.safetensors", t) == 1 << 16
        t.fill_(-1.0)  # the pool holds a copy: changing the tensor now changes nothing written
    pipe.close()
    assert pipe.pool.peak <= 3 << 16 and pipe.files == 12 and pipe.payload_bytes == 12 << 16
    for i in range(12):
        written = read_tensor_file(tmp_path / f"{i}.safetensors")
        assert torch.equal(written, torch.full((64, 256), float(i)))


def test_a_tensor_larger_than_the_pool_is_written_directly(tmp_path: Path) -> None:
    calls: list[str] = []

    def write(path: Path, tensor: torch.Tensor) -> int:
        calls.append(threading.current_thread().name)
        return pipeline_module.write_tensor_file(path, tensor)

    pipe = PayloadPipeline(writers=1, pool_bytes=1 << 16, write=write)
    big = torch.arange(1 << 15, dtype=torch.float32)  # 128 KiB
    pipe.submit(tmp_path / "big.safetensors", big)
    pipe.close()
    assert calls == [threading.current_thread().name] and pipe.pool.peak == 0
    assert torch.equal(read_tensor_file(tmp_path / "big.safetensors"), big)


def test_the_pool_reuses_and_drops_buffers_within_its_capacity() -> None:
    pool = HostPool(4 << 16)
    first = pool.acquire(1000)
    assert first is not None and first.numel() == 1 << 16
    pool.release(first)
    assert pool.acquire(500) is first  # reused
    pool.release(first)
    large = pool.acquire(4 << 16)  # the idle small buffer is dropped to make room
    assert large is not None and large.numel() == 4 << 16 and pool.allocated == 4 << 16
    assert pool.acquire(1, abandon=lambda: True) is None  # full, and told to give up instead of waiting


def test_the_pool_hands_out_the_smallest_free_buffer_that_fits() -> None:
    pool = HostPool(8 << 16)
    small, big = pool.acquire(1 << 16), pool.acquire(3 << 16)
    assert small is not None and big is not None
    pool.release(big)
    pool.release(small)
    assert pool.acquire(2 << 16) is big and pool.acquire(10) is small and pool.allocated == 4 << 16


def test_a_writer_error_marks_the_trace_incomplete_and_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, x = seeded(SharedLoop), toy_input()
    expected = model(x)
    disk = DiskFillsUp(allowed=3)
    monkeypatch.setattr(os, "replace", disk)
    out = None
    with pytest.raises(OutputDirError) as raised, tracediff.capture(model, tmp_path, writers=1) as session:
        out = model(x)
    monkeypatch.undo()
    assert out is not None and torch.equal(out, expected)  # the forward went on
    refused = tmp_path / "SharedLoop.shared@1_outputs.safetensors"
    assert disk.refused == [refused.name]  # one writer: the same file as the synchronous path
    assert str(raised.value) == f"{refused}: could not write payload: No space left on device"
    meta = metadata(tmp_path)
    assert meta["complete"] is False and meta["capture_failure"] == str(raised.value)
    assert session.complete is False and session.files == meta["payload_files"] == 3
    assert not [name for name in files(tmp_path) if name.endswith(".tmp") or name.startswith(".")]


def test_an_unexpected_writer_exception_is_reported_with_the_file(tmp_path: Path) -> None:
    def broken(path: Path, tensor: torch.Tensor) -> int:
        raise RuntimeError("device vanished")

    pipe = PayloadPipeline(writers=1, pool_bytes=1 << 20, write=broken)
    pipe.submit(tmp_path / "a.safetensors", torch.ones(4))
    with pytest.raises(OutputDirError, match=r"a\.safetensors: could not write payload: RuntimeError: device vanished"):
        pipe.close()
    with pytest.raises(OutputDirError):
        pipe.submit(tmp_path / "b.safetensors", torch.ones(4))  # later payloads are refused, naming the first error


def test_verify_stays_bit_identical_with_writer_threads(tmp_path: Path) -> None:
    model, inputs = tiny_llama(layers=2)
    with torch.no_grad(), tracediff.capture(model, tmp_path, writers=2, verify=True) as session:
        model(**inputs)
    assert session.verification is not None and session.verification.identical
    assert json.loads((tmp_path / "tracediff_metadata.json").read_text())["verification"]["identical"] is True


@pytest.mark.parametrize("option", [{"writers": -1}, {"writers": 1.5}, {"pool_mb": -1}, {"pool_mb": True}])
def test_bad_pipeline_options_are_refused_before_anything_runs(tmp_path: Path, option: dict[str, object]) -> None:
    model = seeded(SharedLoop)
    with pytest.raises(UsageError), tracediff.capture(model, tmp_path / "out", **option):  # type: ignore[arg-type]
        model(toy_input())
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


SPEC = '''
import torch
from torch import nn


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), (torch.ones(3, 4),)
'''


def test_the_cli_takes_writers_and_pool_size_and_states_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tracediff.cli.main import main

    spec = tmp_path / "spec.py"
    spec.write_text(SPEC)
    sync, piped = tmp_path / "sync", tmp_path / "piped"
    assert main(["capture", f"{spec}:build", "--out", str(sync), "--writers", "0"]) == 0
    assert main(["capture", f"{spec}:build", "--out", str(piped), "--writers", "2", "--pool-mb", "1"]) == 0
    assert _bytes_of(sync) == _bytes_of(piped)
    stated = metadata(piped)["options"]["payload_pipeline"]
    assert (stated["writers"], stated["pool_bytes"]) == (2, 1 << 20)
    capsys.readouterr()
    assert main(["capture", f"{spec}:build", "--out", str(tmp_path / "bad"), "--writers", "-1"]) == 2
    assert capsys.readouterr().err == ("tracediff capture: error: writers=-1: expected a number of threads, "
                                       "0 or more\n")


def test_after_written_waits_for_every_payload_submitted_before_it(tmp_path: Path) -> None:
    release = threading.Event()
    written: list[str] = []

    def slow(path: Path, tensor: torch.Tensor) -> int:
        if path.name == "a.safetensors":
            release.wait(10)
        written.append(path.name)
        return tensor.numel() * tensor.element_size()

    pipe = PayloadPipeline(writers=2, pool_bytes=1 << 20, write=slow)
    pipe.submit(tmp_path / "a.safetensors", torch.ones(4))  # held back until released
    pipe.submit(tmp_path / "b.safetensors", torch.ones(4))
    seen: list[list[str]] = []
    pipe.after_written(lambda: seen.append(sorted(written)))
    deadline = time.monotonic() + 10
    while "b.safetensors" not in written and time.monotonic() < deadline:
        time.sleep(0.01)
    assert written == ["b.safetensors"] and seen == []  # b is on disk, a is not: not yet
    release.set()
    pipe.close()
    assert seen == [["a.safetensors", "b.safetensors"]]
    pipe.after_written(lambda: seen.append(["now"]))  # nothing pending: runs at once
    assert seen[-1] == ["now"]


def test_after_written_is_not_run_when_a_write_failed(tmp_path: Path) -> None:
    def broken(path: Path, tensor: torch.Tensor) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    pipe = PayloadPipeline(writers=1, pool_bytes=1 << 20, write=broken)
    pipe.submit(tmp_path / "a.safetensors", torch.ones(4))
    ran: list[bool] = []
    pipe.after_written(lambda: ran.append(True))
    with pytest.raises(OutputDirError):
        pipe.close()
    assert ran == []


def test_a_capture_with_writer_threads_journals_a_call_only_once_its_payloads_are_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tracediff import format as fmt
    from tracediff.capturing.journal import Journal

    def slow_write(path: Path, tensor: torch.Tensor) -> int:
        time.sleep(0.005)  # writers fall behind the forward, as on a slow disk
        return write_tensor_file(path, tensor)

    missing: list[str] = []
    unmeasured: list[str] = []
    journaled: list[bytes] = []
    append = Journal._append

    def checked_append(self: Journal, line: bytes) -> None:
        entry = json.loads(line)
        stack: list[object] = [entry.get(fmt.JOURNAL_NODE)]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                value = item.get(fmt.VALUE)
                if isinstance(value, str) and fmt.is_tensor_entry(item):
                    name = value.removeprefix(fmt.PAYLOAD_REFERENCE_PREFIX)
                    if not (self.path.parent / name).is_file():
                        missing.append(name)
                    if not item.get(fmt.STATS) or item.get("mean") == "":  # the writer measures before writing
                        unmeasured.append(name)
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
        journaled.append(line)
        append(self, line)

    monkeypatch.setattr(pipeline_module, "write_tensor_file", slow_write)
    monkeypatch.setattr(Journal, "_append", checked_append)
    model, inputs = tiny_llama()
    session = _capture(model, inputs, tmp_path / "out", writers=2, pool_mb=64)
    exits = [line for line in journaled if fmt.JOURNAL_EXIT in json.loads(line)]
    assert len(exits) == session.calls and missing == []  # type: ignore[attr-defined]
    assert unmeasured == []


@pytest.mark.parametrize("writers", [0, 2])
def test_writer_threads_compute_the_statistics_from_the_host_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writers: int
) -> None:
    from tracediff.capturing import encode

    measured_on: list[str] = []
    real = encode.tensor_stats

    def recording(tensor: torch.Tensor, **options: object) -> dict[str, object]:
        measured_on.append(threading.current_thread().name)
        return real(tensor, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(encode, "tensor_stats", recording)
    model, inputs = tiny_llama(layers=1)
    session = _capture(model, inputs, tmp_path, writers=writers)
    assert len(measured_on) == session.files  # type: ignore[attr-defined]  # each payload measured once
    on_writers = [name for name in measured_on if name.startswith("tracediff-writer-")]
    assert len(on_writers) == (len(measured_on) if writers else 0)
