"""Fast paths of align: bitwise-equal payloads without decoding, half precision without float32 copies."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import tracediff
from tests.alignment.helpers import INPUT_IDS, llama
from tracediff.compare import metrics as metrics_module
from tracediff.compare import raw_payload
from tracediff.compare.metrics import compare_tensors
from tracediff.compare.raw_payload import same_bytes
from tracediff.trace.load import Trace


def _save(path: Path, tensor: torch.Tensor, **more: torch.Tensor) -> Path:
    save_file({"data": tensor, **more}, str(path))
    return path


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raw_payload, "CHUNK_BYTES", 64)
    monkeypatch.setattr(raw_payload, "_local", raw_payload.threading.local())


def test_equal_files_are_found_equal_chunk_by_chunk(tmp_path: Path, small_chunks: None) -> None:
    t = torch.arange(100, dtype=torch.float32)  # 400 bytes: six full chunks and a tail
    assert same_bytes(_save(tmp_path / "a", t), _save(tmp_path / "b", t.clone())) == 100
    nan = torch.tensor([float("nan"), 1.0])
    assert same_bytes(_save(tmp_path / "n1", nan), _save(tmp_path / "n2", nan.clone())) == 2  # NaN bits equal


@pytest.mark.parametrize("where", [0, 37, 99])
def test_one_differing_element_anywhere_is_found(tmp_path: Path, small_chunks: None, where: int) -> None:
    a = torch.arange(100, dtype=torch.float32)
    b = a.clone()
    b[where] = torch.nextafter(b[where], torch.tensor(1e9))
    assert same_bytes(_save(tmp_path / "a", a), _save(tmp_path / "b", b)) is None


def test_equal_bytes_of_another_dtype_or_shape_are_not_equal(tmp_path: Path) -> None:
    a = torch.arange(4, dtype=torch.int32)
    assert same_bytes(_save(tmp_path / "a", a), _save(tmp_path / "f", a.view(torch.float32))) is None
    assert same_bytes(_save(tmp_path / "b", a), _save(tmp_path / "s", a.reshape(2, 2))) is None
    assert same_bytes(tmp_path / "a", _save(tmp_path / "two", a, other=a.clone())) is None  # not a single tensor


def test_anything_unusual_is_left_to_the_decoding_path(tmp_path: Path) -> None:
    good = _save(tmp_path / "good", torch.ones(8))
    truncated = tmp_path / "truncated"
    truncated.write_bytes(good.read_bytes()[:-4])
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\xff" * 8 + b"{" * 40)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for other in (truncated, garbage, fifo, tmp_path / "missing", tmp_path):
        assert same_bytes(good, other) is None and same_bytes(other, good) is None


def _capture(model: torch.nn.Module, out: Path) -> Path:
    with torch.no_grad(), tracediff.capture(model, out):
        model(INPUT_IDS)
    return out


def test_identical_traces_align_without_decoding_a_payload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _capture(llama(), tmp_path / "a"), _capture(llama(), tmp_path / "b")

    def no_decoding(self: Trace, record: object) -> torch.Tensor:
        raise AssertionError("a bitwise-equal payload was decoded")

    monkeypatch.setattr(Trace, "load", no_decoding)
    result = tracediff.align(a, b)
    assert result.passed and result.rows and all(row.status == "identical" for row in result.rows)


def test_the_fast_path_changes_no_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _capture(llama(), tmp_path / "a"), _capture(llama(seed=1), tmp_path / "b")
    fast = tracediff.align(a, b, atol=1e-3).to_dict()
    monkeypatch.setattr(raw_payload, "same_bytes", lambda *paths: None)
    slow = tracediff.align(a, b, atol=1e-3).to_dict()
    def verdicts(rows: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{k: v for k, v in row.items() if k != "reason"} for row in rows]  # notes on the values may differ

    assert verdicts(fast["rows"]) == verdicts(slow["rows"])
    statuses = {r["status"] for r in fast["rows"]}
    assert "identical" in statuses and len(statuses) > 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_pairs_are_compared_without_a_float32_copy_of_the_whole_tensor(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    monkeypatch.setattr(metrics_module, "CHUNK", 1000)
    a = torch.randn(10_000, generator=torch.Generator().manual_seed(0)).to(dtype)
    b = (a.float() * 1.05 + 0.01).to(dtype)
    widest: list[int] = []
    real_as_floats = metrics_module.as_floats

    def watched(values: np.ndarray, dtype: str, work: type, out: np.ndarray | None = None) -> np.ndarray:
        wide = real_as_floats(values, dtype, work, out)
        if dtype in ("bfloat16", "float16"):
            widest.append(wide.size)
        return wide

    monkeypatch.setattr(metrics_module, "as_floats", watched)
    chunked = compare_tensors(a, b, atol=0.0, rtol=0.0)
    monkeypatch.undo()
    assert widest and max(widest) <= 1024  # converted chunk by chunk (and the first 1024 looked at for NaN)
    whole = compare_tensors(a.double(), b.double(), atol=0.0, rtol=0.0)
    assert chunked.mismatched == whole.mismatched and chunked.max_abs_err == whole.max_abs_err
