"""Quantized kernels replaced by plain ones with the weight they apply, for the restored calls of an attribution.

A measured share runs B's forward once per ranked call, with every call after
it restored (:mod:`.restore`). Those restored calls only need to carry the
perturbation from upstream with a Jacobian close to A's; running them through
their quantized kernels costs what the kernel costs (torchao's int4 CPU kernel
on float32 activations is about 40x a float Linear) and, for int8 dynamic
activations, rounds each moved input again, noise as large as what is being
measured. Under :class:`KernelSurrogates` a ``linear`` whose weight is a
tensor subclass (torchao, optimum-quanto) runs as a plain ``linear`` with the
weight its own kernel applies: the subclass's ``dequantize()`` where it has
one (or its one inner tensor's, for a wrapper), else ``linear(I, W)^T`` (one
kernel call on an identity, as costly as a forward of that many tokens).
That is exact for weight-only quantization up to the summation order, and
drops the activations' rounding for dynamic activation quantization: there
(:meth:`KernelSurrogates.same_as_kernel` tells), a restored call's local
error is taken with the same plain kernel (:mod:`.engine`), so what it
subtracts is its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

_PLAIN = (torch.Tensor, nn.Parameter)


def opaque(tensor: Any) -> bool:
    """A tensor subclass (a quantized weight of torchao or optimum-quanto), not a plain tensor."""
    return isinstance(tensor, torch.Tensor) and type(tensor) not in _PLAIN


def opaque_weights(module: nn.Module) -> list[torch.Tensor]:
    return [t for t in (*module.parameters(), *module.buffers()) if opaque(t)]


class KernelSurrogates(TorchFunctionMode):
    """Within the mode, ``linear(x, W)`` with a tensor-subclass ``W`` runs as a plain ``linear`` with the weight
    the subclass's own kernel applies (read once per weight and kept for the mode's life); within
    :meth:`applied_to`, only for the weights given."""

    def __init__(self) -> None:
        super().__init__()
        self._plain: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._same: dict[tuple[int, torch.dtype], tuple[torch.Tensor, bool]] = {}
        self._only: frozenset[int] | None = None

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is nn.functional.linear:
            args = list(args)
            if len(args) > 1 and self._replaces(args[1]):
                args[1] = self.plain(args[1], args[0].dtype)
            elif self._replaces(kwargs.get("weight")):
                kwargs["weight"] = self.plain(kwargs["weight"], args[0].dtype)
        return func(*args, **kwargs)

    def _replaces(self, weight: Any) -> bool:
        return opaque(weight) and (self._only is None or id(weight) in self._only)

    @contextmanager
    def applied_to(self, weights: Iterable[torch.Tensor]) -> Iterator[None]:
        """The mode, replacing the kernels of ``weights`` only (the others run their own)."""
        kept = list(weights)  # alive while their ids are looked up
        previous, self._only = self._only, frozenset(id(w) for w in kept)
        try:
            with self:
                yield
        finally:
            self._only = previous

    def plain(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        cached = self._plain.get(id(weight))
        if cached is not None and cached[0] is weight:
            return cached[1]
        with torch.no_grad():
            plain = _dequantized(weight)
            if plain is None:  # no dequantize of its own: ask its kernel, one call on an identity
                identity = torch.eye(weight.shape[-1], dtype=dtype, device=weight.device)
                plain = nn.functional.linear(identity, weight).t().contiguous()
            plain = plain.to(dtype)
        self._plain[id(weight)] = (weight, plain)  # the weight is kept alive so its id is not reused
        return plain

    def same_as_kernel(self, weight: torch.Tensor, dtype: torch.dtype) -> bool:
        """Whether the plain ``linear`` gives the kernel's answers up to the summation order, on a probe of 8
        rows: so for weight-only quantization, and not where the kernel also rounds its input (int8 dynamic
        activations), nor for a weight that is no ``linear``'s. Both sums of k products (and one scaling) are
        within ``gamma(k + 1) * sum|x w|`` of the exact one in any order, so they differ by at most twice that;
        a low-precision dtype, where that bound says nothing, answers False."""
        cached = self._same.get((id(weight), dtype))
        if cached is not None and cached[0] is weight:
            return cached[1]
        k = weight.shape[-1] if weight.dim() == 2 else 0
        unit = float(torch.finfo(dtype).eps) / 2 if dtype.is_floating_point else 1.0
        same = False
        if k and (k + 1) * unit < 0.1:
            probe = torch.randn(8, k, generator=torch.Generator().manual_seed(0)).to(dtype=dtype,
                                                                                   device=weight.device)
            with torch.no_grad():
                try:
                    kernel = nn.functional.linear(probe, weight)
                except Exception:  # noqa: BLE001 - not a linear's weight: the kernel is not vouched for
                    kernel = None
                if isinstance(kernel, torch.Tensor) and type(kernel) in _PLAIN:
                    plain = self.plain(weight, dtype)
                    gamma = (k + 1) * unit / (1 - (k + 1) * unit)
                    bound = 2 * gamma * (probe.abs() @ plain.abs().t())
                    same = bool(((kernel - nn.functional.linear(probe, plain)).abs() <= bound).all())
        self._same[(id(weight), dtype)] = (weight, same)
        return same


def _dequantized(weight: torch.Tensor, depth: int = 0) -> torch.Tensor | None:
    """``weight.dequantize()`` as a plain tensor of its shape; for a wrapper (torchao's activation-quantizing
    weight) whose own ``dequantize`` is missing, that of its one inner tensor of the same shape."""
    try:
        plain = weight.dequantize()
    except Exception:  # noqa: BLE001 - subclasses raise what they like for an op they do not implement
        plain = None
    if isinstance(plain, torch.Tensor) and type(plain) in _PLAIN and tuple(plain.shape) == tuple(weight.shape):
        return plain
    flatten = getattr(weight, "__tensor_flatten__", None)
    if depth > 2 or flatten is None:
        return None
    try:
        names = flatten()[0]
    except Exception:  # noqa: BLE001
        return None
    inner = [t for t in (getattr(weight, name, None) for name in names)
             if isinstance(t, torch.Tensor) and opaque(t) and tuple(t.shape) == tuple(weight.shape)]
    return _dequantized(inner[0], depth + 1) if len(inner) == 1 else None
