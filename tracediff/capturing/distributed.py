"""What capture needs to know about ``torch.distributed``: rank, world size, DTensors."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..format import dtensor_entry


def _initialized() -> bool:
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized())


def current_rank() -> int:
    """This process's rank, or 0 when not running distributed."""
    return torch.distributed.get_rank() if _initialized() else 0


def world_size() -> int:
    """The number of ranks, or 1 when not running distributed."""
    return torch.distributed.get_world_size() if _initialized() else 1


def is_dtensor(value: Any) -> bool:
    """True for a ``torch.distributed.tensor.DTensor`` (or anything holding a local shard)."""
    return isinstance(value, torch.Tensor) and hasattr(value, "_local_tensor")


def dtensor_layout(value: Any, *, full: bool) -> dict[str, Any]:
    """The ``dtensor`` entry of a DTensor: global shape, placements, and whether the full tensor is recorded."""
    placements = [repr(p) for p in getattr(value, "placements", ())]
    return dtensor_entry(list(value.shape), placements, "full" if full else "local")


def run_start(started: str) -> str:
    """Rank 0's ``started`` on every rank (a broadcast): the identity the ranks of one run share."""
    if not _initialized() or world_size() == 1:
        return started
    shared: list[Any] = [started]
    torch.distributed.broadcast_object_list(shared, src=0)
    return str(shared[0])


#: The collectives that write into their first tensor argument in place.
_IN_PLACE_COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor")


@contextmanager
def versioned_collectives() -> Iterator[None]:
    """Make torch.distributed's in-place collectives bump the version counter of the tensor they write.

    They do not on their own (torch 2.13), so a tensor all-reduced in place after a module returned it looked
    unchanged to the encoder, which then recorded its earlier value again for the caller. Functions are put
    back on exit; code that imported a collective by name before the capture is not reached.
    """
    saved = {name: getattr(torch.distributed, name) for name in _IN_PLACE_COLLECTIVES
             if hasattr(torch.distributed, name)}

    def versioned(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def call(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(tensor, *args, **kwargs)
            if isinstance(tensor, torch.Tensor):
                try:
                    torch.autograd.graph.increment_version(tensor)
                except RuntimeError:  # an inference tensor has no version counter
                    pass
            return result
        return call

    for name, original in saved.items():
        setattr(torch.distributed, name, versioned(original))
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(torch.distributed, name, original)
