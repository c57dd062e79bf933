"""Host arrays: bfloat16 and float8 cross between torch and numpy by their bits, nothing rounded."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tracediff.files.host import host_array, host_tensor

# 1, -2, the smallest subnormal, the largest finite, infinity and a NaN with payload bits
_BF16_BITS = np.array([0x3F80, 0xC000, 0x0001, 0x7F7F, 0x7F80, 0x7FC1], dtype=np.uint16)


def test_a_bfloat16_tensor_goes_to_numpy_as_its_bits() -> None:
    tensor = torch.from_numpy(_BF16_BITS.astype(np.int16)).view(torch.bfloat16)
    bits = host_array(tensor)
    assert bits.dtype == np.dtype("<u2") and bits.tolist() == _BF16_BITS.tolist()
    assert np.shares_memory(bits, tensor.view(torch.int16).numpy())  # a contiguous CPU tensor: no copy


def test_bfloat16_bits_come_back_as_the_same_tensor() -> None:
    back = host_tensor(_BF16_BITS, bits_of="bfloat16")
    assert back.dtype == torch.bfloat16
    assert back.view(torch.int16).numpy().view(np.uint16).tolist() == _BF16_BITS.tolist()
    assert back[:2].tolist() == [1.0, -2.0] and math.isinf(back[4].item()) and math.isnan(back[5].item())


def test_an_ml_dtypes_bfloat16_array_is_read_by_its_bits() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes' bfloat16 is what JAX hands to numpy")
    array = _BF16_BITS.view(ml_dtypes.bfloat16)
    back = host_tensor(array)
    assert back.dtype == torch.bfloat16 and host_array(back).tolist() == _BF16_BITS.tolist()


def test_float8_goes_to_numpy_as_its_bits() -> None:
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8")
    tensor = torch.tensor([1.0, -448.0], dtype=torch.float8_e4m3fn)
    assert host_array(tensor).dtype == np.uint8 and host_array(tensor).tolist() == [0x38, 0xFE]


def test_other_dtypes_keep_their_numpy_dtype_and_share_memory() -> None:
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert np.shares_memory(host_array(tensor), tensor.numpy())
    array = np.arange(4, dtype=np.int64)
    back = host_tensor(array)
    assert back.dtype == torch.int64 and np.shares_memory(back.numpy(), array)


def test_a_copy_is_made_when_asked_or_when_the_array_is_read_only() -> None:
    array = np.arange(4, dtype=np.float32)
    assert not np.shares_memory(host_tensor(array, copy=True).numpy(), array)
    array.flags.writeable = False
    assert not np.shares_memory(host_tensor(array).numpy(), array)  # torch would warn about read-only memory
    bits = _BF16_BITS.copy()
    bits.flags.writeable = False
    assert host_tensor(bits, bits_of="bfloat16")[0].item() == 1.0


def test_a_non_contiguous_tensor_is_copied_in_order() -> None:
    tensor = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).t()
    assert host_tensor(host_array(tensor), bits_of="bfloat16").tolist() == tensor.tolist()


def test_bits_of_other_widths_are_refused() -> None:
    with pytest.raises(TypeError, match="bfloat16 bits must be 16-bit integers, got uint8"):
        host_tensor(np.zeros(2, np.uint8), bits_of="bfloat16")
