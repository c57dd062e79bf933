"""``TRACEDIFF_REORDER`` (tracediff/order.py): the switch really changes the order of the comparison's sums and
merges, and what the kernel returns stays within the rounding bound derived for any order (tests/rounding.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from tests.rounding import U32, U64, mean_error
from tracediff import order
from tracediff.alignment import engine
from tracediff.compare.metrics import compare_tensors
from tracediff.compare.parts import measure_part, merge_parts

Switch = Callable[[str | None], None]


@pytest.fixture
def switch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Switch]:
    """``switch("1")`` sets TRACEDIFF_REORDER (None: unsets it) as a fresh process would read it."""

    def set_to(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv(order.VARIABLE, raising=False)
        else:
            monkeypatch.setenv(order.VARIABLE, value)
        order.reordered.cache_clear()

    yield set_to
    order.reordered.cache_clear()  # the next reader sees the environment monkeypatch restores


@pytest.mark.parametrize("value", [None, "", "0"])
def test_without_the_switch_the_kernels_keep_their_order(switch: Switch, value: str | None) -> None:
    switch(value)
    assert not order.reordered()
    assert order.chunk_size(1 << 18) == 1 << 18
    assert order.merge_order([1, 2, 3]) == [1, 2, 3]
    assert order.worker_threads(2) == 2


def test_the_switch_takes_short_odd_chunks_three_threads_and_merges_backwards(switch: Switch) -> None:
    switch("1")
    assert order.reordered()
    assert (order.chunk_size(1 << 18), order.chunk_size(1 << 20), order.chunk_size(1000)) == (127, 511, 3)
    assert order.chunk_size(3) == 3  # nothing shorter to take
    assert order.merge_order([1, 2, 3]) == [3, 2, 1]
    assert order.worker_threads(2) == 3


def test_the_switch_changes_the_float32_sum_the_kernel_takes(switch: Switch) -> None:
    """|a - b| alternates 2 + 2**-15 and 2 over 12,700 elements. Any 127 of them add up exactly in float32 (23
    significant bits at most), and the chunks' sums add exactly in float64: under the switch the mean is exact.
    Their total, 25400 + 6350 * 2**-15, needs 30 bits: one float32 sum of all of them rounds, in any order and on
    any CPU, so without the switch the mean differs from it, within the bound of mean_error. (b is -1, not 0: a
    zero side sends the sums to the float64 path that guards against underflow.)"""
    n = 127 * 100
    a = np.ones(n, np.float32)
    a[0::2] += np.float32(2.0 ** -15)
    b = np.full(n, -1.0, np.float32)
    exact = (2 * n + (n // 2) * 2.0 ** -15) / n  # the float64 quotient of the exact total
    switch(None)
    whole = compare_tensors(a, b, atol=0, rtol=0).mean_abs_err
    switch("1")
    chunked = compare_tensors(a, b, atol=0, rtol=0).mean_abs_err
    assert chunked == exact
    assert whole != exact
    assert abs(whole - exact) <= mean_error(n, U32) * exact


def test_the_switch_merges_the_ranks_parts_in_the_other_order(switch: Switch) -> None:
    """Three parts whose sums of |a - b| are 1, 2**-53 and 2**-53: added first to last, each 2**-53 is half an ulp
    of 1 and rounds away (to even); last to first, they add to 2**-52 first and 1 + 2**-52 is a float64."""
    a = np.array([1.0, 2.0 ** -53, 2.0 ** -53])
    b = np.zeros(3)
    parts = [measure_part(a[i:i + 1], b[i:i + 1], atol=0, rtol=0) for i in range(3)]
    switch(None)
    forward, _ = merge_parts(parts, atol=0, rtol=0)
    switch("1")
    backward, _ = merge_parts(parts, atol=0, rtol=0)
    assert forward.mean_abs_err == 1.0 / 3
    assert backward.mean_abs_err == (1.0 + 2.0 ** -52) / 3
    exact = (1.0 + 2.0 ** -52) / 3
    for got in (forward, backward):
        assert abs(got.mean_abs_err - exact) <= mean_error(3, U64) * exact
    assert forward.max_abs_err == backward.max_abs_err == 1.0  # maxima and counts have no order
    assert forward.mismatched == backward.mismatched == 3


def test_the_switch_compares_pairs_on_three_threads_whatever_the_size(switch: Switch) -> None:
    def name(_: int) -> str:
        return threading.current_thread().name

    switch(None)
    with engine._workers(0) as run:
        assert set(run(name, range(6))) == {threading.current_thread().name}  # a small trace: no pool
    switch("1")
    with engine._workers(0) as run:
        names = set(run(name, range(64)))
    assert names and all(n.startswith("tracediff-align") for n in names) and len(names) <= 3
