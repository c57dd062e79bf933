"""pcc and positions found in the comparison's own pass (``tracediff.compare.row_pass``), against the
two-pass float64 references they replace (``compare.logits.pearson``, ``compare.positions``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tracediff
from tests.rounding import kappa, pcc_error
from tracediff.alignment import lm_verdicts
from tracediff.compare import metrics
from tracediff.compare.logits import pearson
from tracediff.compare.metrics import compare_tensors, measure_tensors
from tracediff.compare.positions import positions_beyond_tolerance
from tracediff.trace.payload import Payload, as_floats

FIXTURES = __import__("pathlib").Path(__file__).resolve().parents[2] / "fixtures"


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 1,000 elements: a chunk boundary falls inside positions, and every tensor spans many chunks."""
    monkeypatch.setattr(metrics, "CHUNK", 1000)


def _bf16(values: np.ndarray) -> Payload:
    bits = values.astype(np.float32).view(np.uint32)
    return Payload(((bits + 0x8000) >> 16).astype(np.uint16), "bfloat16")  # rounded, not truncated


def _floats(p: Payload | np.ndarray) -> np.ndarray:
    return as_floats(p.values, p.dtype, np.float64) if isinstance(p, Payload) else p.astype(np.float64)


CASES = {
    "noise": lambda rng, a: a + rng.normal(0, 1e-4, a.shape),
    "scaled": lambda rng, a: a * 1.001,
    "large mean": lambda rng, a: a + 300 + rng.normal(0, 1e-3, a.shape),
    "anticorrelated": lambda rng, a: -a + rng.normal(0, 1e-2, a.shape),
    "unrelated": lambda rng, a: rng.normal(0, 1, a.shape),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_pcc_matches_two_pass_pearson(case: str, dtype: str, small_chunks: None) -> None:
    rng = np.random.default_rng(0)
    a64 = rng.normal(0, 1, (3, 37, 64))
    if case == "large mean":
        a64 = a64 + 300
    b64 = CASES[case](rng, a64)
    a: Payload | np.ndarray
    b: Payload | np.ndarray
    if dtype == "bfloat16":
        a, b = _bf16(a64), _bf16(b64)
    else:
        a, b = a64.astype(dtype), b64.astype(dtype)
    expected = pearson(_floats(a), _floats(b))
    _, found = measure_tensors(a, b, atol=1e-5, rtol=1e-5)
    assert found.pcc is not None
    # Both from float64 moments (the pass: each chunk's, merged by Chan's formula; pearson: two passes over the
    # whole pair), each within pcc_error of the exact value in any grouping (tests/rounding.py): any CPU, and
    # the "large mean" case through its kappa (~9e4).
    assert abs(found.pcc - expected) <= 2 * pcc_error(a64.size, expected, kappa(_floats(a), _floats(b)))


def test_pcc_ignores_non_finite_positions_as_pearson_does(small_chunks: None) -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(0, 1, 5000).astype(np.float32)
    b = (a + rng.normal(0, 1e-3, a.size)).astype(np.float32)
    a[[3, 2500]] = np.nan
    b[[7, 4000]] = np.inf
    _, found = measure_tensors(a, b, atol=1e-5, rtol=1e-5)
    assert found.pcc is not None
    expected = pearson(a, b)
    assert abs(found.pcc - expected) <= 2 * pcc_error(a.size, expected, kappa(a, b))  # as above


@pytest.mark.parametrize("side", ["a", "b"])
def test_a_constant_side_has_pcc_nan_as_pearson_says(side: str) -> None:
    """A constant side has no spread: float64 sums of one float32 value are exact, so its centred moment is 0
    and the pass answers NaN, as the two-pass pearson does, without reading the pair again."""
    rng = np.random.default_rng(2)
    varied, constant = rng.normal(0, 1, 4096).astype(np.float32), np.full(4096, 0.1, np.float32)
    a, b = (constant, varied) if side == "a" else (varied, constant)
    assert math.isnan(pearson(a, b))
    assert math.isnan(measure_tensors(a, b, atol=1e-5, rtol=1e-5)[1].pcc)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("shape,dim", [((2, 50, 24), 1), ((1, 4, 50, 7), 2), ((3, 50), 1), ((1, 3, 5000, 1), 2)])
def test_positions_match_the_reference(dtype: str, shape: tuple[int, ...], dim: int, small_chunks: None) -> None:
    rng = np.random.default_rng(3)
    a64 = rng.normal(0, 1, shape)
    b64 = a64 + rng.normal(0, 1e-7, shape)  # within tolerance everywhere...
    moved = np.moveaxis(b64, dim, 0)
    for pos in (17, 18, 41):  # ...but these positions
        moved[pos].flat[rng.integers(0, moved[pos].size)] += 0.5
    if dtype == "bfloat16":
        a, b = _bf16(a64), _bf16(b64)
    else:
        a, b = a64.astype(dtype), b64.astype(dtype)
    atol, rtol = 1e-2, 1e-2
    m, found = measure_tensors(a, b, atol=atol, rtol=rtol, along=dim)
    expected = positions_beyond_tolerance(_floats(a), _floats(b), atol=atol, rtol=rtol, dim=dim)
    assert found.positions == expected
    assert expected.first == 17 and expected.count == 3
    assert m == compare_tensors(a, b, atol=atol, rtol=rtol)  # the metrics are those of the pass without extras


def test_positions_near_the_tolerance_are_settled_in_float64(small_chunks: None) -> None:
    """Elements within float32 rounding of atol + rtol |a| are decided in float64, for the count and the
    positions alike."""
    rng = np.random.default_rng(4)
    a = rng.normal(0, 1, (1, 64, 40)).astype(np.float32)
    atol, rtol = 1e-3, 1e-3
    bound = atol + rtol * np.abs(a.astype(np.float64))
    b = (a.astype(np.float64) + bound * rng.choice([0.9999999, 1.0, 1.0000001], a.shape)).astype(np.float32)
    m, found = measure_tensors(a, b, atol=atol, rtol=rtol, along=1)
    expected = positions_beyond_tolerance(a, b, atol=atol, rtol=rtol, dim=1)
    assert found.positions == expected
    assert (m.mismatched > 0) == (expected.count > 0)


def test_positions_with_nan_and_infinities(small_chunks: None) -> None:
    a = np.zeros((1, 30, 100), np.float32)
    b = a.copy()
    a[0, 5, 3] = b[0, 5, 3] = np.nan  # NaN against NaN: no error
    a[0, 9, 0] = b[0, 9, 0] = np.inf  # the same infinity: no error
    b[0, 12, 7] = np.nan
    b[0, 20, 99] = -np.inf
    _, found = measure_tensors(a, b, atol=1e-5, rtol=1e-5, along=1)
    assert found.positions == positions_beyond_tolerance(a, b, atol=1e-5, rtol=1e-5, dim=1)
    assert found.positions is not None and (found.positions.first, found.positions.count) == (12, 2)


def test_identical_pair_has_pcc_one_and_no_position() -> None:
    a = np.arange(600, dtype=np.float32).reshape(1, 20, 30)
    _, found = measure_tensors(a, a.copy(), atol=0, rtol=0, along=1)
    assert found.pcc == 1.0
    assert found.positions is not None and (found.positions.first, found.positions.count) == (None, 0)


def test_align_reads_each_differing_pair_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows get pcc and positions from the comparison: only logits rows are read again (and the first
    divergence, once, for its per-position strip), and every row's pcc and positions agree with the two-pass
    references."""
    ref, bug = FIXTURES / "llama_tiny" / "ref", FIXTURES / "llama_tiny" / "port_bug"
    read_again: list[str] = []
    reader = lm_verdicts._read_pair

    def counting(a, ra, b, rb):  # type: ignore[no-untyped-def]
        read_again.append(rb.slot)
        return reader(a, ra, b, rb)

    monkeypatch.setattr(lm_verdicts, "_read_pair", counting)
    result = tracediff.align(ref, bug)
    monkeypatch.undo()
    differing = [row for row in result.rows if row.status in ("close", "diverged") and not row.approximate]
    assert differing and any(row.positions_beyond for row in differing)
    others = [slot for slot in read_again if slot != "outputs.logits"]
    assert result.position_strip is not None and len(others) == 1, read_again  # the strip
    trace_a, trace_b = tracediff.load_trace(ref), tracediff.load_trace(bug)
    records_a = {(node.module_path, node.call_index, r.slot): r for node, r in trace_a.records()}
    records_b = {(node.module_path, node.call_index, r.slot): r for node, r in trace_b.records()}
    for row in differing:
        ra = records_a[(row.module_path_a, row.call_index_a, row.tensor_a)]
        rb = records_b[(row.module_path_b, row.call_index_b, row.tensor)]
        pa, pb = trace_a.load_payload(ra), trace_b.load_payload(rb)
        va, vb = _floats(pa), _floats(pb)
        expected = pearson(va, vb)
        # as in test_pcc_matches_two_pass_pearson
        assert row.pcc is not None and (math.isnan(expected) and math.isnan(row.pcc)
                                        or abs(row.pcc - expected) <= 2 * pcc_error(va.size, expected, kappa(va, vb)))
        if row.within_tolerance is False and row.position is not None:
            dim = next(d for d in range(1, va.ndim) if va.shape[d] == va.shape[1])
            found = positions_beyond_tolerance(va, vb, atol=row.atol, rtol=row.rtol, dim=dim)
            assert row.positions_beyond == found.count
