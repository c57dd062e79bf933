"""The error-growth plot of an ``Alignment`` as an image (PNG, SVG or PDF), for papers, issues and PRs.

Needs matplotlib (``pip install 'tracediff[plot]'``). The figure is built
without ``pyplot``, so it touches no global matplotlib state (backend,
open figures) and works in scripts, servers and notebooks alike.

What it shows: the max-abs and max-relative error of every compared tensor
in B's execution order on a log scale, the atol applied to each row (dashed),
rows out of tolerance in red, and the first divergence marked; with a
baseline, the noise band (K x each row's noise floor, shaded), and every
error source as a triangle on the axis. Exact zeros
sit on a band below the smallest error, labelled ``0``; rows that could not
be compared (shape mismatch, unreadable) are marked ``x`` at the top.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

from ..alignment.result import Alignment
from ..errors import OutputDirError, UsageError

_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


def check_plot_target(path: str | os.PathLike[str]) -> str:
    """Check that an image can be written to ``path`` (matplotlib present, known suffix); return its format.

    Raises:
        UsageError: matplotlib is missing, or the suffix is not .png/.svg/.pdf.
    """
    target = Path(path)
    fmt = _FORMATS.get(target.suffix.lower())
    if fmt is None:
        raise UsageError(f"{target}: unknown image type {target.suffix!r}; use a .png, .svg or .pdf file name")
    _require_matplotlib()
    return fmt


def _require_matplotlib() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("matplotlib is not installed; install it with: pip install 'tracediff[plot]'") from None
    return Figure


def error_figure(result: Alignment, *, title: str | None = None) -> Any:
    """The plot as a matplotlib ``Figure`` (10 x 4 inches), for further styling."""
    figure_class = _require_matplotlib()
    fig = figure_class(figsize=(10, 4), layout="constrained")
    ax = fig.add_subplot()
    rows = list(result.rows)
    k = result.noise_factor
    bands = [r.noise_floor * k if k is not None and r.noise_floor is not None else math.nan for r in rows]
    positive = [v for r in rows for v in (r.max_abs_err, r.max_rel_err, r.atol) if math.isfinite(v) and v > 0]
    positive += [v for v in bands if math.isfinite(v) and v > 0]
    lo = 10.0 ** (math.floor(math.log10(min(positive))) - 1) if positive else 1e-9
    hi = 10.0 ** math.ceil(math.log10(max(positive))) if positive else 1.0

    def shown(value: float) -> float:
        if math.isnan(value):
            return math.nan
        return lo if value <= 0 else min(value, hi)

    x = [r.order for r in rows]
    if any(math.isfinite(v) for v in bands):  # the noise band: below K x the baseline's floor is rounding noise
        ax.fill_between(x, [lo / 2] * len(x), [shown(v) for v in bands], step="mid", color="#16a34a", alpha=0.15,
                        linewidth=0, label=f"noise band ({k:g} x floor)")
    ax.plot(x, [shown(r.atol) for r in rows], drawstyle="steps-mid", linestyle="--", color="#6b7280",
            linewidth=1.1, label="atol")
    ax.plot(x, [shown(r.max_rel_err) for r in rows], color="#e08a00", linewidth=1.0, alpha=0.85,
            label="max rel error")
    ax.plot(x, [shown(r.max_abs_err) for r in rows], color="#2563eb", linewidth=1.5, marker="o",
            markersize=2.5 if len(rows) <= 600 else 0, label="max abs error")
    bad = [r for r in rows if r.diverged and not math.isnan(r.max_abs_err)]
    if bad:
        ax.scatter([r.order for r in bad], [shown(r.max_abs_err) for r in bad], s=14, color="#c62828", zorder=3,
                   label="out of tolerance")
    failed = [r.order for r in rows if math.isnan(r.max_abs_err)]
    if failed:
        ax.scatter(failed, [hi] * len(failed), marker="x", color="#8e44ad", zorder=3, label="not comparable")
    ax.set_yscale("log")
    ax.set_ylim(lo / 2, hi * 2)
    ticks = [t for t in ax.get_yticks() if lo < t <= hi]
    ax.set_yticks([lo, *ticks], ["0", *(f"1e{round(math.log10(t))}" for t in ticks)])
    if result.sources:
        ax.scatter([r.order for r in result.sources], [lo / 2] * len(result.sources), marker="^", s=40,
                   color="#7c3aed", zorder=4, clip_on=False, label="error source")
    first = result.first_divergence
    if first is not None:
        ax.axvline(first.order, color="#c62828", linestyle=":", linewidth=1.3)
        right = first.order > (rows[-1].order if rows else 0) / 2
        ax.annotate(f"first divergence: {first.module_path_b} {first.tensor}", xy=(first.order, hi),
                    xytext=(-6 if right else 6, -4), textcoords="offset points", ha="right" if right else "left",
                    va="top", color="#c62828", fontsize=9)
    ax.set_xlabel("compared tensor, in B's execution order")
    ax.set_ylabel("error")
    ax.grid(True, which="major", color="#e5e7eb", linewidth=0.6)
    ax.legend(loc="lower right", fontsize=8, frameon=False, ncols=2)
    verdict = "passed" if result.passed else "undecided" if result.verdict == "undecided" else \
        f"{len(result.diverged)} of {len(rows)} tensors out of tolerance"
    ax.set_title(title or f"{result.model_b} vs {result.model_a}: {verdict}", fontsize=11, loc="left")
    return fig


def plot_alignment(result: Alignment, path: str | os.PathLike[str], *, title: str | None = None,
                   dpi: int = 150) -> Path:
    """Write the error-growth plot of ``result`` to ``path`` (format from its suffix: .png, .svg, .pdf).

    The file is written atomically (temporary file, then rename) and replaced
    if it exists. Returns the path written.

    Raises:
        UsageError: matplotlib is missing, or the suffix is not .png/.svg/.pdf.
        OutputDirError: the file cannot be written.
    """
    target = Path(path)
    fmt = check_plot_target(target)
    fig = error_figure(result, title=title)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent if str(target.parent)
                               else ".")
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=fmt, dpi=dpi)
        os.replace(tmp, target)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OutputDirError(f"{target}: could not write the plot: {e.strerror or e}") from e
    return target
