"""Content hashes follow the documented algorithm and do not depend on layout, process or device."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from tracediff.steps.hashing import combine_hashes, tensor_hash
from tracediff.steps.records import aggregate_hash


def _documented(dtype: str, shape: str, data: bytes) -> str:
    return hashlib.sha256(f"{dtype}|{shape}|".encode() + data).hexdigest()


def test_float32_hash_is_sha256_of_header_and_little_endian_bytes() -> None:
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7
    data = np.asarray(t.numpy(), dtype="<f4").tobytes()
    assert tensor_hash(t) == _documented("float32", "2,3", data)


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16"])
def test_low_precision_hash_uses_the_stored_bits(dtype: str) -> None:
    t = (torch.linspace(-3, 3, 10)).to(getattr(torch, dtype))
    bits = t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)
    data = np.asarray(bits.numpy(), dtype="<u1" if t.element_size() == 1 else "<i2").tobytes()
    assert tensor_hash(t) == _documented(dtype, "10", data)


def test_hash_ignores_memory_layout_but_not_shape_or_dtype() -> None:
    t = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    assert tensor_hash(t.t()) == tensor_hash(t.t().contiguous())
    assert tensor_hash(t) != tensor_hash(t.reshape(5, 4))
    assert tensor_hash(t) != tensor_hash(t.view(torch.int32))
    assert tensor_hash(torch.tensor(1.5)) == _documented("float32", "", np.float32(1.5).tobytes())
    assert tensor_hash(torch.zeros(0, 3)) == _documented("float32", "0,3", b"")


def test_negative_and_conjugate_views_hash_their_values() -> None:
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    assert tensor_hash(z.conj()) == tensor_hash(torch.tensor([1 - 2j, 3 + 1j], dtype=torch.complex64))


def test_group_hash_is_sha256_of_name_tab_hash_lines() -> None:
    pairs = [("a.weight", "11"), ("a.bias", None)]
    assert combine_hashes(pairs) == hashlib.sha256(b"a.weight\t11\na.bias\t-\n").hexdigest()
    params = {"w": {"hash": "ab", "shape": [1]}, "lr": {"py_type": "float", "value": 0.5}}
    expected = hashlib.sha256(
        b"w\tab\nlr\tvalue:" + json.dumps(["float", 0.5]).encode() + b"\n").hexdigest()
    assert aggregate_hash("params", params) == expected


@pytest.mark.slow
def test_hash_is_the_same_in_another_process_which_imports_no_cli_renderer_or_lightning() -> None:
    code = (
        "import sys, torch\n"
        "from tracediff.steps.hashing import tensor_hash\n"
        "import tracediff.steps\n"
        "t = torch.linspace(-1, 1, 97).to(torch.bfloat16)\n"
        "print(tensor_hash(t))\n"
        "print(sorted(m for m in sys.modules if m.startswith(('lightning', 'pytorch_lightning',"
        " 'tracediff.cli', 'tracediff.render'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == tensor_hash(torch.linspace(-1, 1, 97).to(torch.bfloat16))
    assert out[1] == "[]"
