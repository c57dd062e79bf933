"""Statistics queued on the device and read back in batches agree with the host path.

The device path runs on GPUs; here it is forced onto CPU tensors, which
exercises the same kernels and the same bookkeeping.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import tracediff
from tests.capturing.helpers import metadata, nodes, tensor_entries, trace_json
from tests.models import tiny_llama
from tracediff.capturing import device_stats
from tracediff.capturing.device_stats import DeviceStats
from tracediff.capturing.stats import StatsBuffers, placeholder_strings, string_fields, tensor_stats

inf, nan = math.inf, math.nan


@pytest.fixture
def on_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_stats, "_DEVICES_READ_DIRECTLY", {"meta"})


def _queued(tensor: torch.Tensor, pending: DeviceStats) -> tuple[dict[str, Any], dict[str, Any]]:
    stats: dict[str, Any] = {}
    entry: dict[str, Any] = {"shape": "s", **(placeholder_strings(tensor) or {}), "stats": stats}
    pending.launch(tensor, entry, stats)
    return entry, stats


def _same(got: dict[str, Any], want: dict[str, Any], *, exact: bool) -> None:
    assert list(got) == list(want)  # same keys in the same order
    for key, value in want.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(got[key]), key
        elif exact or key in ("numel", "min", "max", "nan", "posinf", "neginf", "zeros"):
            assert got[key] == value, key
        else:
            assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-12), key


CASES = {
    "float64": torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(0)),
    "float32 with zeros": torch.tensor([0.0, -0.0, 1.5, -2.25, 3.0]),
    "bfloat16": torch.randn(257, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16),
    "float16": torch.randn(33, generator=torch.Generator().manual_seed(2)).to(torch.float16),
    "nan and inf": torch.tensor([1.0, nan, inf, -inf, 0.0, -3.0, nan]),
    "only non-finite": torch.tensor([nan, inf, nan]),
    "only -inf": torch.tensor([-inf, -inf]),
    "one element": torch.tensor([2.5]),
    "int64": torch.tensor([[3, 0, -7], [0, 12, 5]]),
    "uint8": torch.tensor([0, 255, 7], dtype=torch.uint8),
    "bool": torch.tensor([True, False, True]),
    "all true": torch.ones(4, dtype=torch.bool),
    "empty": torch.zeros(0, 3),
    "complex": torch.tensor([1 + 2j]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_device_statistics_agree_with_the_host_statistics(name: str) -> None:
    tensor = CASES[name]
    pending = DeviceStats(StatsBuffers())
    entry, stats = _queued(tensor, pending)
    pending.resolve()
    want = tensor_stats(tensor)
    _same(stats, want, exact=tensor.dtype == torch.float64 or not tensor.is_floating_point())
    if tensor.is_floating_point() and tensor.numel():
        assert set(string_fields(want, tensor.dtype)) <= set(entry)
        assert all(entry[key] for key in ("mean", "std", "min", "max"))


def test_chunks_combine_to_the_statistics_of_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_stats, "DEVICE_CHUNK", 7)
    tensor = torch.randn(100, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    tensor[[5, 50]] = torch.tensor([nan, -inf], dtype=torch.float64)
    pending = DeviceStats(StatsBuffers())
    _, stats = _queued(tensor, pending)
    _, int_stats = _queued(torch.arange(-20, 30), pending)
    pending.resolve()
    _same(stats, tensor_stats(tensor), exact=False)
    assert int_stats == tensor_stats(torch.arange(-20, 30))


def test_nothing_is_read_back_until_a_batch_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real = device_stats._read_back

    def counted(parts: list[torch.Tensor]) -> list[float | int]:
        reads.append(len(parts))
        return real(parts)

    monkeypatch.setattr(device_stats, "_read_back", counted)
    pending = DeviceStats(StatsBuffers(), batch=4)
    queued = [_queued(torch.full((3,), float(i)), pending)[1] for i in range(6)]
    assert reads == [4] and [bool(s) for s in queued] == [True] * 4 + [False] * 2  # one read for four tensors
    pending.resolve()
    assert reads == [4, 2] and queued[5]["mean"] == 5.0 and len(pending) == 0


def _stats_by_file(folder: Path) -> list[Any]:
    tree = trace_json(folder)
    return [(entry.get("value"), entry["stats"], entry.get("mean")) for node in nodes(tree)
            for key in ("inputs", "outputs") for entry in tensor_entries(node.get(key))]


def test_a_capture_measuring_on_the_device_writes_the_trace_of_the_host_path(
    tmp_path: Path, on_device: None
) -> None:
    model, inputs = tiny_llama(layers=1)
    model = model.double()
    # writers=0: writer threads would measure the payloads on the host
    with torch.no_grad(), tracediff.capture(model, tmp_path / "device", writers=0):
        model(**inputs)
    device_stats._DEVICES_READ_DIRECTLY.add("cpu")
    with torch.no_grad(), tracediff.capture(model, tmp_path / "host", writers=0):
        model(**inputs)
    for kind in ("FULL_TENSORS", "SUMMARY"):  # float64 sums are the same on both paths: the same text
        (device_file,) = (tmp_path / "device").glob(f"*{kind}.json")
        (host_file,) = (tmp_path / "host").glob(f"*{kind}.json")
        assert device_file.read_text() == host_file.read_text()
    assert metadata(tmp_path / "device")["complete"] is True
    assert len(_stats_by_file(tmp_path / "device")) > 20


@pytest.mark.parametrize("tensors,batch", [("summary", 16), ("full", 10_000)])
def test_a_call_is_journaled_once_its_device_statistics_are_read_back(
    tmp_path: Path, on_device: None, monkeypatch: pytest.MonkeyPatch, tensors: str, batch: int
) -> None:
    from tracediff import format as fmt
    from tracediff.capturing.journal import Journal

    monkeypatch.setattr(device_stats, "DEFAULT_BATCH", batch)
    incomplete: list[str] = []
    exits: list[int] = []
    append = Journal._append

    def checked_append(self: Journal, line: bytes) -> None:
        entry = json.loads(line)
        if fmt.JOURNAL_EXIT in entry:
            exits.append(entry[fmt.JOURNAL_EXIT])
            for tensor in tensor_entries(entry[fmt.JOURNAL_NODE]):
                if not tensor["stats"] or tensor.get("mean") == "":  # a placeholder: not read back yet
                    incomplete.append(tensor["shape"])
        append(self, line)

    monkeypatch.setattr(Journal, "_append", checked_append)
    model, inputs = tiny_llama(layers=2)
    with torch.no_grad(), tracediff.capture(model, tmp_path, tensors=tensors, writers=0) as session:  # type: ignore[arg-type]
        model(**inputs)
    assert incomplete == [] and sorted(exits) == list(range(session.calls))
