"""Judging errors against noise: the baseline's noise floor, and the cross-dtype rule without one.

**With a baseline.** The baseline N is the reference run under B's
conditions (B's dtype, device and kernels): ``tracediff capture ref.py:build
--out ref-bf16 --dtype bfloat16``. For each compared pair (A, B) the same
metrics between A and N measure what rounding alone does to that tensor:

* ``noise_floor``: ``max_abs_err`` between A and N for the same node and slot;
* ``noise_ratio``: ``max_abs_err(A, B) / noise_floor`` (``None`` when the
  floor is zero or the baseline has no usable counterpart);
* a row out of the ordinary tolerance is accepted when its error is at most
  ``noise_factor x noise_floor`` (and no NaN or infinity differs); its status
  becomes ``close`` and the reason says by how much.

Rows of B with no counterpart in N, or whose floor is zero, keep the
ordinary tolerance and their reason says so.

**Without a baseline, across dtypes.** When the two sides of a pair have
different floating dtypes (an fp32 reference against a bf16 port), rounding
noise counts as error. Such a row that fails the elementwise rule is still
accepted when its relative RMS error, ``rms_err / rms(a)`` with ``rms(a)``
taken from A's recorded mean and std, is at most the pair's rtol (the less
precise dtype's: 1.6e-2 for bfloat16, 1e-3 for float16). That rule passes
most rows of clean bf16 ports, not all (errors grow with depth), and it
passes small bugs too: the trustworthy verdict needs a baseline.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from ...compare.measurement import Measurement
from ...compare.relative import relative_of
from ...compare.tolerance import computed_dtype
from ...trace.load import Trace
from ...trace.model import Node, TensorRecord
from ..result import TensorComparison
from ..rows import RowDraft, add_note

DEFAULT_NOISE_FACTOR = 3.0
"""Errors up to 3x the baseline's noise floor are noise (see docs/verdicts.md for the measurements)."""


def baseline_records(trace_n: Trace) -> dict[tuple[tuple[str, str, int], str], TensorRecord]:
    """N's records by (node key, slot): the baseline runs the reference's code, so paths match A's."""
    return {(node.key, record.slot): record for node in trace_n.nodes() for record in node.tensors}


def counterpart(records: dict[tuple[tuple[str, str, int], str], TensorRecord], node_a: Node,
                ra: TensorRecord) -> TensorRecord | None:
    return records.get((node_a.key, ra.slot))


def floor_of(measurement: Measurement | None) -> float | None:
    """The noise floor from the A-vs-N measurement, or None when it measured nothing usable."""
    if measurement is None:
        return None
    value = measurement.max_abs_err
    if not isinstance(value, float) or math.isnan(value) or math.isinf(value):
        return None
    if measurement.nan_mismatch or measurement.inf_mismatch:
        return None
    return value


def apply_floor(row: RowDraft, floor: float | None, noise_factor: float) -> None:
    """Set ``noise_floor``/``noise_ratio`` of a draft and accept it within ``noise_factor`` x the floor."""
    if floor is None:
        add_note(row, "no baseline counterpart: ordinary tolerance applied")
        return
    error = row.max_abs_err
    ratio = error / floor if floor > 0 and not math.isnan(error) else None
    row.noise_floor, row.noise_ratio = floor, ratio
    if floor == 0 and row.diverged:
        add_note(row, "the baseline equals A here (zero floor): ordinary tolerance applied")
    elif row.diverged and ratio is not None and ratio <= noise_factor and not _beyond_any_tolerance(row):
        _accept(row, f"within {noise_factor:g}x the baseline's noise floor (noise ratio {ratio:.3g})")
    elif row.diverged and ratio is not None:
        add_note(row, f"{ratio:.3g}x the baseline's noise floor {floor:.3g}")


def rms_of(record: TensorRecord) -> float | None:
    """``sqrt(std^2 + mean^2)`` from a record's statistics: the root mean square of its values."""
    mean, std = record.stats.get("mean"), record.stats.get("std")
    if not isinstance(mean, (int, float)) or not isinstance(std, (int, float)):
        return None
    value = math.sqrt(float(std) ** 2 + float(mean) ** 2)
    return value if math.isfinite(value) else None


def accept_by_relative_norm(row: RowDraft, ra: TensorRecord, computed: Computed = (None, None)) -> None:
    """The cross-dtype rule without a baseline: ``rms_err <= rtol * rms(a)`` accepts a diverged draft.

    ``computed``: the dtype each side computed in where its tensors do not show it (``Trace.compute_dtype``): a
    float32 tensor that a runtime computed in bfloat16 is a bfloat16 side."""
    dtypes = computed_dtype(row.dtype_a, computed[0]), computed_dtype(row.dtype_b, computed[1])
    if not row.diverged or dtypes[0] == dtypes[1] or _beyond_any_tolerance(row):
        return
    if not _is_float(row.dtype_a) or not _is_float(row.dtype_b) or math.isnan(row.rms_err):
        return
    rms = rms_of(ra)
    if rms is None or rms == 0 or row.rms_err > row.rtol * rms:
        return
    _accept(row, f"accepted across dtypes: relative RMS error {relative_of(row.rms_err, rms):.3g} <= rtol "
                 f"{row.rtol:.3g} "
                 f"({row.mismatch_fraction:.1%} of elements beyond the elementwise tolerance)")


def _beyond_any_tolerance(row: RowDraft) -> bool:
    """No tolerance accepts the row, so no noise rule does: NaN or infinities on one side only, or positions
    masked on one side only (``required_atol`` is infinite for each)."""
    return bool(row.nan_mismatch or row.inf_mismatch) or math.isinf(row.required_atol)


def _accept(row: RowDraft, reason: str) -> None:
    row.within_tolerance, row.status, row.reason = True, "close", reason


def _is_float(dtype: str | None) -> bool:
    name = (dtype or "").removeprefix("torch.")
    return name.startswith(("float", "bfloat"))


Computed = tuple[str | None, str | None]  # the dtype A and B computed in, where their tensors do not show it


def main_float_dtype(records: Iterable[str | None]) -> str | None:
    """The most frequent floating dtype among the dtypes of a trace's compared records."""
    counts = Counter(records)  # counted first: a trace has a handful of distinct dtypes and a row per tensor
    floats = Counter({d: n for d, n in counts.items() if _is_float(d)})
    return floats.most_common(1)[0][0] if floats else None


def dtype_warning(rows: Sequence[TensorComparison], computed: Computed = (None, None)) -> str | None:
    """The warning for a cross-dtype comparison without a baseline, or None when the dtypes agree. A side that
    computed in another dtype than its tensors show (``computed``, from its metadata) is said first."""
    stored_a = main_float_dtype(r.dtype_a for r in rows)
    stored_b = main_float_dtype(r.dtype_b for r in rows)
    dtype_a, dtype_b = computed_dtype(stored_a, computed[0]), computed_dtype(stored_b, computed[1])
    if dtype_a is None or dtype_b is None or dtype_a == dtype_b:
        return None
    short_b = dtype_b.removeprefix("torch.")
    for side, stored, dtype in (("B", stored_b, dtype_b), ("A", stored_a, dtype_a)):
        if stored != dtype and dtype is not None and stored is not None:
            short, other = dtype.removeprefix("torch."), (dtype_a if side == "B" else dtype_b) or ""
            return (f"{side} computed in {short} (its runtime's precision, the trace metadata's compute_dtype), "
                    f"though its tensors are {stored.removeprefix('torch.')}; the other side computed in "
                    f"{other.removeprefix('torch.')}: judged at {short}'s tolerance, rounding noise is counted as "
                    "error, so precision noise and a real bug can look alike. For a verdict against noise, capture "
                    f"the reference in {short} and pass it as the baseline: tracediff capture SPEC --out "
                    f"ref-{short} --dtype {short}; tracediff align A B --baseline ref-{short}")
    return (f"A is {dtype_a.removeprefix('torch.')} and B is {short_b}: rounding noise is counted as error, "
            "so precision noise and a real bug can look alike. For a verdict against noise, capture the "
            f"reference in B's dtype and pass it as the baseline: tracediff capture SPEC --out ref-{short_b} "
            f"--dtype {short_b}; tracediff align A B --baseline ref-{short_b}")
