"""The float64 oracle: is B's math different, or does B only round differently?

For each output tensor three values are at hand: A's recorded output ``a``
(dtype ``dA``), B's output ``b`` in B's own dtype ``dB``, and ``exact``, the
same module of B run in float64 (a float64 copy of B's model, on A's inputs
upcast to float64). Over the positions where all three are finite:

* ``precision_noise = rms(b - exact)``: how far B's own dtype and kernels
  take it from its exact math;
* ``math_diff = rms(a - exact)``: how far A is from B's exact math;
* ``noise_budget = max(precision_noise, precision_noise * eps(dA) / eps(dB),
  eps(coarser of dA, dB) / 2 * rms(exact))``: B's noise, A's noise
  estimated from it by the ratio of machine epsilons, and at least one
  rounding of the output at the coarser precision (which covers weights
  stored in that precision: B's exact run uses B's rounded weights);
* ``factor = math_diff / noise_budget``.

The verdict is ``same math`` when ``factor <= NOISE_MULTIPLIER`` (default
8), ``B differs`` otherwise. This is the rule of torch's own accuracy checks
(``torch._dynamo.utils.same``: the result's RMS error against an fp64 run is
at most a small multiple of the reference's), with A in the result's place
and the multiple widened because A's kernels are not B's. Integer and bool
outputs have no rounding: they are the same math only when equal.

The float64 run is made only for calls with an output out of tolerance.
The float64 copy runs on B's device when it is CPU or CUDA, and on the CPU
otherwise (MPS has no float64). It holds 8 bytes per parameter.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

NOISE_MULTIPLIER = 8.0


def oracle_device(device: torch.device) -> torch.device:
    """Where the float64 copy runs: B's device when it computes float64 well, else the CPU."""
    return device if device.type in ("cpu", "cuda") else torch.device("cpu")


def float64_copy(model: nn.Module, device: torch.device) -> nn.Module:
    """A float64 copy of ``model`` on ``device``, consistent in float64 wherever a tensor comes from.

    Floating parameters and buffers are converted, and so are the tensors its modules keep in plain
    attributes (rotary tables cached as ``_cos_cached``, a mask built once); every submodule call casts
    its floating inputs (positional, keyword, nested) to float64 on entry, and inside :func:`float64_ops`
    (where the copy runs) so does every op, so a value made in float32 at call time (a table or mask
    computed from a float32 constant) never meets a float64 one in a kernel that wants one dtype
    (``scaled_dot_product_attention``, ``matmul``).
    """
    clone = copy.deepcopy(model)
    # positional: some models override ``to`` with one positional argument (transformer-lens)
    clone = clone.to(device).to(torch.float64).eval()
    for module in clone.modules():
        for name, value in list(vars(module).items()):
            if name in ("_parameters", "_buffers", "_modules"):  # converted by ``to`` above
                continue
            converted = _in_float64(value)
            if converted is not value:
                object.__setattr__(module, name, converted)
        module.register_forward_pre_hook(_float64_inputs, with_kwargs=True)
    return clone


def _in_float64(value: Any) -> Any:
    """``value`` with every floating tensor in float64 (tuples, lists and dicts rebuilt); as is otherwise."""
    if isinstance(value, torch.Tensor):
        return value.to(torch.float64) if value.is_floating_point() and value.dtype != torch.float64 else value
    if isinstance(value, (tuple, list)):
        items = [_in_float64(item) for item in value]
        if all(x is y for x, y in zip(items, value)):
            return value
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if type(value) is dict:
        changed = {key: _in_float64(item) for key, item in value.items()}
        return value if all(changed[key] is value[key] for key in value) else changed
    return value


class _Float64Ops(TorchFunctionMode):
    """Every torch function sees its floating tensor arguments in float64 (in-place ops and attribute reads
    excepted: they must act on the tensor itself)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        in_place = (name.endswith("_") and not name.endswith("__")) or name.startswith("__i") or \
            name in ("__get__", "__set__", "__setitem__", "__delitem__")
        if not in_place:
            args, kwargs = _in_float64(args), _in_float64(kwargs)
        if name in _GROUPED_MM:
            exact = _grouped_mm_float64(*args, **kwargs)
            if exact is not None:
                return exact
        return func(*args, **kwargs)


# torch's grouped matmul (transformers' mixture-of-experts layers at their default, ``grouped_mm``) has no
# float64 kernel: the float64 run computes it group by group, the same sums in float64
_GROUPED_MM = ("grouped_mm", "_grouped_mm")


def _grouped_mm_float64(mat_a: Any, mat_b: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None
                        ) -> torch.Tensor | None:
    """``mat_a [S, K]`` rows ``offs[g-1]:offs[g]`` times ``mat_b[g] [K, N]``, in float64; None for other forms."""
    if not (isinstance(mat_a, torch.Tensor) and isinstance(mat_b, torch.Tensor) and isinstance(offs, torch.Tensor)
            and mat_a.dtype == torch.float64 and mat_a.dim() == 2 and mat_b.dim() == 3 and bias is None
            and out_dtype in (None, torch.float64)):
        return None
    out = mat_a.new_zeros(mat_a.shape[0], mat_b.shape[-1])
    start = 0
    for group, end in enumerate(offs.tolist()):
        out[start:end] = mat_a[start:end] @ mat_b[group]
        start = end
    return out


def float64_ops() -> TorchFunctionMode:
    """A context in which the float64 copy runs: a tensor its code makes at call time in another floating
    dtype (a table from a float32 constant, a mask from ``torch.full``) enters each op in float64."""
    return _Float64Ops()


def _float64_inputs(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
                    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    new_args, new_kwargs = _in_float64(args), _in_float64(kwargs)
    if new_args is args and new_kwargs is kwargs:
        return None
    return new_args, new_kwargs


@dataclass(frozen=True)
class OracleView:
    precision_noise: float
    math_diff: float
    noise_budget: float
    factor: float

    @property
    def same_math(self) -> bool:
        return self.factor <= NOISE_MULTIPLIER


def _eps(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) if dtype.is_floating_point else 0.0


def _rms(x: torch.Tensor) -> float:
    return float(x.square().mean().sqrt()) if x.numel() else 0.0


def judge(a: torch.Tensor, b: torch.Tensor, exact: torch.Tensor) -> OracleView:
    """The oracle's view of one output tensor (same shapes; see the module docstring for the rule)."""
    dtype_a, dtype_b = a.dtype, b.dtype
    ea, eb, ex = (t.detach().to("cpu", torch.float64).reshape(-1) for t in (a, b, exact))
    if not (dtype_a.is_floating_point or dtype_b.is_floating_point):
        differs = not torch.equal(ea, eb)
        return OracleView(0.0, float(differs), 0.0, math.inf if differs else 0.0)
    finite = torch.isfinite(ea) & torch.isfinite(eb) & torch.isfinite(ex)
    ea, eb, ex = ea[finite], eb[finite], ex[finite]
    noise = _rms(eb - ex)
    diff = _rms(ea - ex)
    eps_a = _eps(dtype_a) or _eps(dtype_b)
    eps_b = _eps(dtype_b) or eps_a
    budget = max(noise, noise * eps_a / eps_b, 0.5 * max(eps_a, eps_b) * _rms(ex))
    if budget == 0.0:
        factor = 0.0 if diff == 0.0 else math.inf
    else:
        factor = diff / budget
    return OracleView(precision_noise=noise, math_diff=diff, noise_budget=budget, factor=factor)
