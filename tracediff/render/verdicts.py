"""The verdict lines shared by the text renderers: the baseline summary, the error sources, ignored rows."""

from __future__ import annotations

import math

from ..alignment.result import Alignment, TensorComparison

SOURCES_SHOWN = 5


def _dtype(result: Alignment) -> str:
    if result.computed_b:  # B's tensors are float32, its runtime computed in bf16: the floor is bf16's
        return result.computed_b.removeprefix("torch.")
    dtypes = [r.dtype_b for r in result.rows if r.noise_floor is not None and r.dtype_b]
    name = max(set(dtypes), key=dtypes.count) if dtypes else ""
    return name.removeprefix("torch.")


def baseline_line(result: Alignment) -> str | None:
    """``A vs B with baseline N: every tensor within K x the bfloat16 noise floor`` (or where it is not)."""
    if result.baseline is None:
        return None
    k = f"{result.noise_factor:g}" if result.noise_factor is not None else "K"
    floor = f"the {_dtype(result)} noise floor".replace("the  ", "the ")
    head = f"A vs B with baseline {result.baseline}"
    beyond = [r for r in result.rows if r.noise_ratio is not None and r.noise_ratio > (result.noise_factor or math.inf)]
    if not beyond:
        return f"{head}: every tensor within {k} x {floor}"
    worst = max(beyond, key=lambda r: r.noise_ratio or 0.0)
    return (f"{head}: {len(beyond)} tensor(s) beyond {k} x {floor}, first {beyond[0].module_path_b} "
            f"{beyond[0].tensor} ({beyond[0].noise_ratio:.3g}x), largest {worst.module_path_b} {worst.tensor} "
            f"({worst.noise_ratio:.3g}x)")


def origin_note(row: TensorComparison) -> str | None:
    """The caller named for an input changed between module calls (from the row's reason)."""
    for part in row.reason.split("; "):
        if part.startswith("changed by the code of "):
            return part
    return None


def source_lines(result: Alignment, *, all_sources: bool = False) -> list[str]:
    """Every place where error is introduced rather than inherited, in execution order (top 5 by default)."""
    if not result.sources:
        return []
    shown = result.sources if all_sources else result.sources[:SOURCES_SHOWN]
    lines = [f"error sources ({len(result.sources)}; growth = error over what flowed in, in units of "
             + ("the noise floor):" if result.baseline else "the tolerance):")]
    for number, row in enumerate(shown, 1):
        growth = "inf" if row.growth is not None and math.isinf(row.growth) else f"{row.growth or 0:.3g}"
        noise = f", {row.noise_ratio:.3g}x noise floor" if row.noise_ratio is not None else ""
        op = f"{row.op} #{row.op_index} inside " if row.op is not None else ""
        lines.append(f"  {number}. {op}{row.module_path_b} {row.tensor} ({row.origin}): growth {growth}, "
                     f"max_abs_err={row.max_abs_err:.3g}{noise}")
    if len(shown) < len(result.sources):
        lines.append(f"  ({len(result.sources) - len(shown)} more; --all lists every one, --next N centres the "
                     "table on source N+1)")
    return lines


def ignored_lines(result: Alignment) -> list[str]:
    if not result.ignored:
        return []
    out_of = sum(r.diverged for r in result.ignored)
    return [f"ignored on purpose: {len(result.ignored)} tensor(s), {out_of} of them out of tolerance (--ignore)"]


def focus_row(result: Alignment, focus: int) -> TensorComparison | None:
    """The row a report centres on: the first divergence, or source ``focus + 1`` with ``--next``."""
    if focus <= 0 or not result.sources:
        return result.first_divergence
    return result.sources[min(focus, len(result.sources) - 1)]
