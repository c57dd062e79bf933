"""Hostile and malformed dumps: each is refused with exit code 2 and one line naming the file; nothing runs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.safety.helpers import cli


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def _import(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code, out, err = cli(["import", "tensors", str(src), "--out", str(tmp_path / "trace")], capsys)
    assert out == "" and err.count("\n") == 1
    assert not (tmp_path / "trace").exists()  # a failed import leaves nothing behind
    return code, err


@pytest.fixture
def src(tmp_path: Path) -> Path:
    folder = tmp_path / "dump"
    folder.mkdir()
    np.save(folder / "layers.0.npy", np.ones((2, 3), dtype=np.float32))
    return folder


def test_a_pickled_pt_file_with_code_is_refused_and_never_run(src: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    torch.save({"output": _RunsCode(marker)}, src / "layers.1.pt")
    code, err = _import(src, tmp_path, capsys)
    assert code == 2 and not marker.exists()
    assert err.startswith(f"tracediff import: error: {src / 'layers.1.pt'}: holds pickled objects other than "
                          "tensors, which are never unpickled (torch.load(weights_only=True) refused: ")


def test_a_link_out_of_the_dump_is_refused(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outside = tmp_path / "secret.npy"
    np.save(outside, np.zeros(2, dtype=np.float32))
    (src / "layers.1.npy").symlink_to(outside)
    code, err = _import(src, tmp_path, capsys)
    assert (code, err) == (2, f"tracediff import: error: {src / 'layers.1.npy'}: links outside {src.resolve()}; "
                              "refused\n")


def test_a_link_to_a_folder_outside_is_refused(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "elsewhere").mkdir()
    (src / "more").symlink_to(tmp_path / "elsewhere")
    code, err = _import(src, tmp_path, capsys)
    assert (code, err) == (2, f"tracediff import: error: {src / 'more'}: links outside {src.resolve()}; refused\n")


def test_a_fifo_is_refused_without_blocking(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(src / "layers.1.npy")
    code, err = _import(src, tmp_path, capsys)
    assert (code, err) == (2, f"tracediff import: error: {src / 'layers.1.npy'}: the npy file is a FIFO, not a "
                              "regular file; refused\n")


def test_an_npy_whose_shape_needs_more_data_than_it_holds(src: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = src / "layers.1.npy"
    np.save(path, np.ones((4, 4), dtype=np.float32))
    path.write_bytes(path.read_bytes()[:-8])
    code, err = _import(src, tmp_path, capsys)
    assert (code, err) == (2, f"tracediff import: error: {path}: holds 56 bytes of data; shape [4, 4] of <f4 needs "
                              "64 (truncated or not a .npy file)\n")


def test_an_npy_header_over_the_limit(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = src / "layers.1.npy"
    path.write_bytes(b"\x93NUMPY\x02\x00" + (64 << 20).to_bytes(4, "little") + b"{")
    code, err = _import(src, tmp_path, capsys)
    assert (code, err) == (2, f"tracediff import: error: {path}: .npy header of 67,108,864 bytes, over the limit of "
                              "1,048,576; refused\n")


@pytest.mark.parametrize(("content", "message"), [
    (b"not numpy at all", "not a .npy file (no \\x93NUMPY magic at the start)"),
    (b"\x93NUMPY\x01\x00\x0c\x00__import__('os')", ".npy header is not {'descr': str, 'fortran_order': bool, "
                                                  "'shape': tuple of sizes}; refused"),
    (b"\x93NUMPY\x01\x00\x36\x00{'descr': '|O', 'fortran_order': False, 'shape': (1,)}",
     "cannot read the .npy data of dtype '|O' (Object arrays cannot be loaded when allow_pickle=False)"),
])
def test_malformed_npy_files(content: bytes, message: str, src: Path, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    path = src / "layers.1.npy"
    path.write_bytes(content)
    code, err = _import(src, tmp_path, capsys)
    assert (code, err) == (2, f"tracediff import: error: {path}: {message}\n")


def test_a_safetensors_file_whose_offsets_leave_it(src: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    header = b'{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'
    path = src / "sub" / "layers.1.safetensors"
    path.parent.mkdir()
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    code, err = _import(src, tmp_path, capsys)
    assert (code, err) == (2, f"tracediff import: error: {path}: tensor 'x' spans bytes 0 to 16 of 8; its shape [4] "
                              "needs 16\n")


def test_a_folder_without_tensor_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "notes.txt").write_text("hello")
    code, err = _import(tmp_path / "dump", tmp_path, capsys)
    assert (code, err) == (2, f"tracediff import: error: {tmp_path / 'dump'}: holds no .npy, .npz, .safetensors, .pt "
                              "or .pth file; nothing to import\n")


def test_align_on_a_folder_that_is_neither_keeps_the_trace_error(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    code, out, err = cli(["align", str(tmp_path / "empty"), str(tmp_path / "empty")], capsys)
    assert code == 2 and out == ""
    assert err == (f"tracediff align: error: {tmp_path / 'empty'}: no *_debug_tree_FULL_TENSORS.json or "
                   "*_debug_tree_SUMMARY.json found\n")


def test_two_files_for_one_slot(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (src / "layers").mkdir()
    np.save(src / "layers" / "0.npy", np.ones((2, 3), dtype=np.float32))
    code, err = _import(src, tmp_path, capsys)
    assert (code, err) == (2, f"tracediff import: error: {src / 'layers' / '0.npy'}: layers.0 (call 0) outputs is "
                              f"also given by {src / 'layers.0.npy'}; name each tensor once\n")


def test_a_file_is_not_a_dump_folder(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _import(src / "layers.0.npy", tmp_path, capsys)
    assert (code, err) == (2, f"tracediff import: error: {src / 'layers.0.npy'}: not a folder; a dump is a folder "
                              "(for one tensor file, put it in a folder of its own)\n")
