"""Captures on a CUDA device: payloads, statistics and alignment against a CPU capture.

Skipped where no CUDA device is present (CI); run on a GPU machine with
``python -m pytest tests/capturing/test_cuda.py``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import tracediff
from tests.capturing.helpers import find, metadata, payload, tensor_entries, trace_json
from tests.format.conformance import check_folder
from tests.models import tiny_llama
from tracediff.capturing.stats import tensor_stats

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

EXACT_KEYS = ("numel", "min", "max", "nan", "posinf", "neginf", "zeros")


def _on_cuda(dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    model, inputs = tiny_llama(layers=2)
    return model.to("cuda", dtype), {k: v.to("cuda") for k, v in inputs.items()}


def _capture(model: torch.nn.Module, inputs: dict[str, torch.Tensor], out: Path, **options: object) -> None:
    with torch.no_grad(), tracediff.capture(model, out, **options):  # type: ignore[arg-type]
        model(**inputs)
    torch.cuda.synchronize()


def _check_stats(folder: Path, *, exact: bool) -> int:
    """Every entry's statistics against ``tensor_stats`` of its payload on the host; the number checked."""
    checked = 0
    for entry in tensor_entries(trace_json(folder)):
        if "value" not in entry:
            continue
        want = tensor_stats(payload(folder, entry).clone())  # aligned as the writer's buffers: the same sums
        got = entry["stats"]
        assert list(got) == list(want)
        for key, value in want.items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(got[key]), key
            elif exact or key in EXACT_KEYS:
                assert got[key] == value, key
            else:
                assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-9), key
        checked += 1
    return checked


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_writer_threads_write_the_bytes_of_the_synchronous_path_and_measure_the_host_copy(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    model, inputs = _on_cuda(dtype)
    _capture(model, inputs, tmp_path / "sync", writers=0)
    _capture(model, inputs, tmp_path / "pipe", writers=2)
    for name in ("sync", "pipe"):
        assert check_folder(tmp_path / name) == 3
        assert metadata(tmp_path / name)["complete"] is True
    sync_files = sorted(p.name for p in (tmp_path / "sync").glob("*.safetensors"))
    assert sync_files == sorted(p.name for p in (tmp_path / "pipe").glob("*.safetensors")) and len(sync_files) > 30
    for name in sync_files:
        assert (tmp_path / "sync" / name).read_bytes() == (tmp_path / "pipe" / name).read_bytes(), name
    # writer threads measure the host copy with the host path: the very numbers of tensor_stats
    assert _check_stats(tmp_path / "pipe", exact=True) > 30
    # written in the hook, the statistics are queued on the device and summed in float64
    assert _check_stats(tmp_path / "sync", exact=False) > 30


def test_summary_statistics_on_the_device_match_the_host(tmp_path: Path) -> None:
    model, inputs = _on_cuda()
    _capture(model, inputs, tmp_path / "full", writers=2)
    _capture(model, inputs, tmp_path / "summary", tensors="summary")
    full = {id_: entry for id_, entry in enumerate(tensor_entries(trace_json(tmp_path / "full")))}
    summary = list(tensor_entries(trace_json(tmp_path / "summary")))
    assert len(summary) == len(full) and all(entry["device"] == "cuda:0" for entry in summary)
    for got, want in zip(summary, full.values()):
        for key, value in want["stats"].items():
            if key in EXACT_KEYS:
                assert got["stats"][key] == value, key
            else:
                assert got["stats"][key] == pytest.approx(value, rel=1e-5, abs=1e-9), key


def test_a_cuda_tensor_changed_in_place_after_it_was_recorded_keeps_its_recorded_values(tmp_path: Path) -> None:
    class ModifiesRecorded(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(256, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.inner(x)
            for _ in range(20):  # queued behind the copy of ``y``: they must not overtake it
                y.mul_(1.5)
            return y

    torch.manual_seed(0)
    model = ModifiesRecorded().cuda()
    x = torch.randn(512, 256, device="cuda")
    with torch.no_grad():
        recorded = model.inner(x).cpu()
        with tracediff.capture(model, tmp_path, writers=2):
            model(x)
    (inner,) = find(trace_json(tmp_path), "ModifiesRecorded.inner")
    assert torch.equal(payload(tmp_path, inner["outputs"]), recorded)
    assert inner["outputs"]["stats"]["max"] == float(recorded.max())


def test_a_cuda_capture_aligns_with_the_cpu_capture_of_the_same_model(tmp_path: Path) -> None:
    model, inputs = tiny_llama(layers=2)
    _capture(model, inputs, tmp_path / "cpu", writers=0)
    model, inputs = _on_cuda()
    _capture(model, inputs, tmp_path / "cuda", writers=2)
    report = tracediff.align(tmp_path / "cpu", tmp_path / "cuda", atol=1e-4, rtol=1e-4)
    assert report.passed, report.first_divergence
    assert len(report.rows) > 30
