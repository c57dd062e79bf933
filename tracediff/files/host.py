"""Host arrays: a tensor as numpy, and a numpy array as a CPU tensor, with bfloat16 and float8 kept by their bits.

numpy has no bfloat16 (ml_dtypes adds one, which torch does not read) and no float8, so a tensor of those dtypes
is handed to numpy as its bit patterns, ``uint16`` or ``uint8`` (:data:`BIT_DTYPES`), exactly as a payload file
stores them; the way back reads an ml_dtypes ``bfloat16`` array, or the 16-bit integers holding its bits, as
``torch.bfloat16``. Nothing is rounded on the way: a value, NaN payloads included, keeps its bits.

torch is imported only when a conversion needs it.

Example::

    >>> import torch
    >>> bits = host_array(torch.tensor([1.0, -2.0], dtype=torch.bfloat16))
    >>> bits.dtype.name, bits.tolist()
    ('uint16', [16256, 49152])
    >>> host_tensor(bits, bits_of="bfloat16").tolist()
    [1.0, -2.0]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["BIT_DTYPES", "host_array", "host_tensor"]

#: The numpy dtype holding the bits of each torch dtype numpy has no type for (little-endian).
BIT_DTYPES: dict[str, np.dtype[Any]] = {
    "bfloat16": np.dtype("<u2"), "float8_e4m3fn": np.dtype("u1"), "float8_e5m2": np.dtype("u1"),
    "float8_e4m3fnuz": np.dtype("u1"), "float8_e5m2fnuz": np.dtype("u1"), "float8_e8m0fnu": np.dtype("u1"),
}


def host_array(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` (detached, on the CPU) as numpy: bfloat16 and float8 as their bits (:data:`BIT_DTYPES`).

    Shares the tensor's memory when it is a contiguous CPU tensor; otherwise holds a copy. A complex tensor's
    lazy conjugation is applied first. Raises ``TypeError`` for a dtype numpy cannot hold (torch's own error).
    """
    import torch

    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    bits = BIT_DTYPES.get(str(t.dtype).removeprefix("torch."))
    if bits is not None:
        return t.contiguous().view(torch.int16 if bits.itemsize == 2 else torch.uint8).numpy().view(bits)
    return t.resolve_conj().numpy()


def host_tensor(array: np.ndarray, *, bits_of: str | None = None, copy: bool = False) -> torch.Tensor:
    """``array`` as a CPU tensor of the same dtype; ml_dtypes' ``bfloat16`` read by its bits as ``torch.bfloat16``.

    ``bits_of="bfloat16"``: ``array`` holds bfloat16 bit patterns in 16-bit integers (a runtime's raw buffer)
    and is read as ``torch.bfloat16``. The tensor shares ``array``'s memory, except when ``copy`` is set (the
    runtime may reuse the buffer) or ``array`` is read-only or not contiguous: then it owns a copy.
    """
    import torch

    values = np.ascontiguousarray(array)
    if copy or not values.flags.writeable:
        values = values.copy()
    if values.dtype.name == "bfloat16" or bits_of == "bfloat16":
        if values.dtype.itemsize != 2:
            raise TypeError(f"bfloat16 bits must be 16-bit integers, got {values.dtype}")
        return torch.from_numpy(values.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(values)
