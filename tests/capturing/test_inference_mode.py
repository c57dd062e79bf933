"""A capture under ``torch.inference_mode()``, the way many inference scripts run a model.

Tensors made there keep no version counter: reading one raised inside the encoder ("Inference tensors do not
track version counter") and the capture failed at the first module. Such a tensor is encoded anew each time
it is seen, since nothing can tell whether it changed in place.
"""

from __future__ import annotations

import torch

import tracediff
from tests.models import tiny_llama


def _capture(out, *, inference: bool, ops: bool = False):
    model, inputs = tiny_llama(layers=2)
    with torch.inference_mode(inference), torch.no_grad(), tracediff.capture(model, out, ops=ops):
        model(**inputs)
    return tracediff.load_trace(out)


def test_inference_mode_capture_is_complete_and_aligns_with_no_grad(tmp_path):
    plain = _capture(tmp_path / "no_grad", inference=False)
    inferred = _capture(tmp_path / "inference", inference=True)
    assert inferred.incomplete_reason is None
    assert [n.module_path for n in inferred.nodes()] == [n.module_path for n in plain.nodes()]
    # The same kernels on the same inputs: every tensor is bitwise the same.
    result = tracediff.align(plain, inferred)
    assert result.passed and len(result.rows) > 0


def test_inference_mode_records_in_place_ops(tmp_path):
    # An in-place op changes an inference tensor whose version cannot be read: it is recorded, not taken for a
    # no-op that returns its input unchanged.
    class InPlace(torch.nn.Module):
        def forward(self, x):
            y = x * 2
            y.add_(1)
            return y

    model = InPlace()
    with torch.inference_mode(), tracediff.capture(model, tmp_path / "t", ops=True):
        model(torch.ones(3))
    ops = [op.op for n in tracediff.load_trace(tmp_path / "t").nodes() for op in n.ops]
    assert any(op.endswith("add_") for op in ops), ops
