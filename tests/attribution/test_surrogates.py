"""Plain kernels in place of quantized ones: the weight they apply is the one the quantized kernel applies."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tracediff.attribution.surrogates import KernelSurrogates, opaque, opaque_weights

from . import models

KINDS = [("torchao", "int8wo"), ("torchao", "int8dyn"), ("torchao", "int4wo"), ("quanto", "qint8"),
         ("quanto", "qint4")]


def _quantized_linear(library: str, kind: str) -> tuple[nn.Linear, nn.Module]:
    pytest.importorskip("torchao" if library == "torchao" else "optimum.quanto",
                        reason="the ports extra installs torchao and optimum-quanto")
    torch.manual_seed(0)
    float_model = nn.Sequential(nn.Linear(64, 96)).eval()
    quantized = copy.deepcopy(float_model)
    getattr(models, library)(kind)(quantized, "")
    return float_model[0], quantized[0]


@pytest.mark.parametrize(("library", "kind"), KINDS)
def test_the_plain_weight_is_the_one_the_kernel_applies(library: str, kind: str) -> None:
    float_linear, linear = _quantized_linear(library, kind)
    assert opaque(linear.weight) and opaque_weights(linear) == [linear.weight] and not opaque_weights(float_linear)
    plain = KernelSurrogates().plain(linear.weight, torch.float32)
    assert type(plain) is torch.Tensor and plain.shape == float_linear.weight.shape
    with torch.no_grad():
        # each row of the identity picks one column of the weight: one product by 1 and sums of zeros, exact in
        # any summation order, so the kernel's own answer is the weight it applies, bit for bit
        applied = nn.functional.linear(torch.eye(64), linear.weight).t()
    assert torch.equal(plain, applied)
    # and it is the quantized weight, not the float one: within a quantization step of it, never equal
    assert not torch.equal(plain, float_linear.weight)
    weight = float_linear.weight.detach()
    assert float((plain - weight).abs().max()) < 0.2 * float(weight.abs().max())


@pytest.mark.parametrize(("library", "kind"), KINDS)
def test_within_the_mode_linear_runs_the_plain_kernel(library: str, kind: str) -> None:
    _, linear = _quantized_linear(library, kind)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    surrogates = KernelSurrogates()
    with torch.no_grad():
        real = linear(x)
        with surrogates:
            plain = linear(x)
            again = surrogates.plain(linear.weight, torch.float32)
        expected = nn.functional.linear(x, again, linear.bias)
    assert again is surrogates.plain(linear.weight, torch.float32)  # read once per weight
    assert torch.equal(plain, expected)
    if kind == "int8dyn":
        # the real kernel also rounds the activations to int8 (a step of max|x|/127 per row): visibly apart
        assert float((real - plain).abs().max()) > 1e-3
    else:
        # weight-only: the same 64 products and the bias, summed in another order. Each float32 result is within
        # gamma_65 * sum|terms| of the exact one (65 * 2**-24, any order), so they differ by at most twice that
        terms = x.abs() @ again.abs().t() + linear.bias.detach().abs()
        assert float(((real - plain).abs() - 2 * 65 * 2.0**-24 * terms).max()) <= 0


@pytest.mark.parametrize(("library", "kind"), KINDS)
def test_a_probe_tells_weight_only_kernels_from_ones_that_round_activations(library: str, kind: str) -> None:
    _, linear = _quantized_linear(library, kind)
    surrogates = KernelSurrogates()
    # weight-only: the plain kernel is the module's own, and its local error needs no second run
    assert surrogates.same_as_kernel(linear.weight, torch.float32) is (kind != "int8dyn")
    # float32's bound says something; bfloat16's (k = 64 products at 2**-9 each) does not: never vouched for
    assert surrogates.same_as_kernel(linear.weight, torch.bfloat16) is False
