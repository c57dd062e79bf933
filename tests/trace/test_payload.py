"""Payloads decoded with numpy give exactly torch's values, and a damaged header is one line naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tracediff.errors import PayloadError, PayloadFormatError
from tracediff.trace.payload import as_floats, finite_max, payload_of, read_payload

FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
          torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu]


def _saved(folder: Path, tensor: torch.Tensor, name: str = "p.safetensors") -> Path:
    save_file({"data": tensor}, str(folder / name))
    return folder / name


def _every_value(dtype: torch.dtype) -> torch.Tensor:
    """Every bit pattern of a 1- or 2-byte float dtype (NaN and infinities included); random values otherwise."""
    if dtype.itemsize == 1:
        return torch.arange(256, dtype=torch.uint8).view(dtype)
    if dtype.itemsize == 2:
        return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    values = torch.randn(100, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    return torch.cat([values, torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0], dtype=dtype)])


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_every_float_dtype_decodes_to_torchs_values(tmp_path: Path, dtype: torch.dtype) -> None:
    tensor = _every_value(dtype)
    payload = read_payload(_saved(tmp_path, tensor), root=tmp_path)
    assert payload.dtype == str(dtype).removeprefix("torch.") and payload.shape == tuple(tensor.shape)
    for work, wide in ((np.float32, torch.float32), (np.float64, torch.float64)):
        got = as_floats(payload.values, payload.dtype, work)
        assert got.dtype == work
        assert np.array_equal(got, tensor.to(wide).numpy(), equal_nan=True)
    assert finite_max(payload.dtype) == torch.finfo(dtype).max
    assert payload_of(tensor).values.tobytes() == payload.values.tobytes()  # a user's tensor: the same bits


@pytest.mark.parametrize("tensor", [
    torch.arange(-5, 5, dtype=torch.int64).reshape(2, 5), torch.tensor([2**62, -(2**62)]),
    torch.arange(7, dtype=torch.int8), torch.tensor([True, False, True]), torch.arange(6, dtype=torch.uint8),
    torch.arange(6, dtype=torch.int16), torch.arange(6, dtype=torch.int32), torch.arange(6).to(torch.uint16),
    torch.complex(torch.randn(3, 2), torch.randn(3, 2)), torch.zeros(0, 4), torch.tensor(3.5),
], ids=lambda t: f"{t.dtype}{list(t.shape)}")
def test_other_dtypes_and_shapes_decode_as_torch_reads_them(tmp_path: Path, tensor: torch.Tensor) -> None:
    payload = read_payload(_saved(tmp_path, tensor), root=tmp_path)
    assert payload.dtype == str(tensor.dtype).removeprefix("torch.") and payload.shape == tuple(tensor.shape)
    assert np.array_equal(payload.values, tensor.numpy())


def test_values_are_mapped_not_copied(tmp_path: Path) -> None:
    payload = read_payload(_saved(tmp_path, torch.arange(1000.0)), root=tmp_path)
    assert not payload.values.flags.writeable and not payload.values.flags.owndata


@pytest.mark.parametrize("damage, reason", [
    (lambda data: data[:-4], "its data offsets end at byte"),
    (lambda data: data + b"\0" * 4, "its data offsets end at byte"),
    (lambda data: data[:6], "shorter than its 8-byte header length"),
    (lambda data: (10**9).to_bytes(8, "little") + data[8:], "header length 1,000,000,000 does not fit the file"),
    (lambda data: data.replace(b'"F32"', b'"X32"'), "tensor 'data' has dtype 'X32', which tracediff does not read"),
    (lambda data: data.replace(b"[2,2]", b"[2,3]"), "tensor 'data': its data offsets do not hold its shape and dtype"),
    (lambda data: data.replace(b"{", b"[", 1), "its header is not JSON"),
], ids=["truncated", "trailing", "tiny", "header-length", "dtype", "shape", "json"])
def test_a_damaged_payload_is_one_line_naming_the_file(tmp_path: Path, damage: object, reason: str) -> None:
    path = _saved(tmp_path, torch.ones(2, 2))
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    with pytest.raises(PayloadError) as raised:
        read_payload(path, root=tmp_path)
    message = str(raised.value)
    assert message.startswith(f"{path}: not a readable safetensors file (") and reason in message
    assert "\n" not in message


def test_a_payload_without_the_data_key(tmp_path: Path) -> None:
    save_file({"other": torch.ones(2)}, str(tmp_path / "p.safetensors"))
    with pytest.raises(PayloadFormatError, match=r"p\.safetensors: a payload holds one tensor under the key "
                                                 r"'data': expected 'data', found 'other'$"):
        read_payload(tmp_path / "p.safetensors", root=tmp_path)


def test_a_payload_outside_the_folder_or_not_a_file_is_refused(tmp_path: Path) -> None:
    outside = _saved(tmp_path, torch.ones(2))
    inside = tmp_path / "trace"
    inside.mkdir()
    (inside / "link.safetensors").symlink_to(outside)
    with pytest.raises(Exception, match="links outside"):
        read_payload(inside / "link.safetensors", root=inside)
    with pytest.raises(PayloadError, match="the payload is a directory, not a regular file; refused"):
        read_payload(inside, root=tmp_path)
    with pytest.raises(PayloadError, match="payload file is missing"):
        read_payload(inside / "missing.safetensors", root=inside)
