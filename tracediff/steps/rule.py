"""The pass rule for one recorded entry of run B against the same entry of run A.

Applied in this order; the first clause that decides wins, and its name is
reported as ``Verdict.clause``:

1. **missing**: an entry recorded in one run only diverges (``only in A``).
2. **not_recorded**: an entry holding ``error`` in either run diverges.
3. **identical**: equal hashes (tensors, RNG states, reprs) or equal JSON
   values (hyperparameters, plain batch values) are identical.
4. **values**: differing plain values or RNG states diverge; no tolerance applies.
5. **layout**: tensors whose shape or dtype differ diverge.
6. **special_values**: tensors whose ``nan``, ``posinf`` or ``neginf`` counts
   differ (when recorded) diverge.
7. **exact**: with ``atol == rtol == 0`` (the default) any other hash
   difference diverges.
8. **no_statistics**: with a tolerance, tensors that share none of
   ``TOLERANCE_STATS`` diverge: nothing quantifies the difference.
9. **tolerance**: otherwise each statistic ``s`` of ``TOLERANCE_STATS`` the
   two entries share must satisfy ``|b_s - a_s| <= atol + rtol * |a_s|``
   (run A is the reference); two NaN are equal, NaN against a number is not,
   equal infinities are equal. All pass: ``within_tolerance``; else diverged.

Statistics summarise a tensor, so the tolerance check cannot see differences
that keep them (two elements swapped): only the exact mode proves identity.
``drift`` is the largest ``|b_s - a_s|`` over the shared statistics, reported
whatever the mode.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..compare.rule import allowed_error, passes
from ..format import REPR, typed_value_content
from .records import entry_identity
from .result import Verdict

TOLERANCE_STATS = ("min", "max", "mean", "abs_mean", "std", "median")
EXACT_COUNTS = ("nan", "posinf", "neginf")


def judge(a: dict[str, Any] | None, b: dict[str, Any] | None, *, atol: float, rtol: float) -> Verdict:
    """Compare entry ``b`` (run B) with entry ``a`` (run A) by the rule in the module docstring."""
    if a is None or b is None:
        return Verdict("diverged", "missing", "only in B" if a is None else "only in A")
    if "error" in a or "error" in b:
        return Verdict("diverged", "not_recorded", f"not recorded: {a.get('error') or b.get('error')}")
    if entry_identity(a) == entry_identity(b):
        return Verdict("identical", "identical", "identical")
    if "shape" not in a or "shape" not in b:
        return Verdict("diverged", "values", _value_reason(a, b))
    if a["shape"] != b["shape"]:
        return Verdict("diverged", "layout", f"shape {a['shape']} vs {b['shape']}")
    if a.get("dtype") != b.get("dtype"):
        return Verdict("diverged", "layout", f"dtype {a.get('dtype')} vs {b.get('dtype')}")
    sa, sb = a.get("stats") or {}, b.get("stats") or {}
    drift, rel_drift = stat_drift(sa, sb)
    for count in EXACT_COUNTS:
        if count in sa and count in sb and sa[count] != sb[count]:
            reason = f"{count} count {sa[count]} vs {sb[count]}"
            return Verdict("diverged", "special_values", reason, drift, rel_drift)
    if atol == 0 and rtol == 0:
        measured = f" (largest statistic drift {drift:.3g})" if drift is not None else ""
        return Verdict("diverged", "exact", f"contents differ{measured}", drift, rel_drift)
    if drift is None:
        return Verdict("diverged", "no_statistics", "contents differ; no statistics recorded to check the tolerance")
    for stat in TOLERANCE_STATS:
        if _number(sa.get(stat)) and _number(sb.get(stat)) and not _close(sa[stat], sb[stat], atol, rtol):
            allowed = allowed_error(abs(sa[stat]), atol, rtol)
            return Verdict("diverged", "tolerance", f"{stat} {sa[stat]:.6g} vs {sb[stat]:.6g}: off by "
                           f"{_gap(sa[stat], sb[stat]):.3g}, allowed {allowed:.3g}", drift, rel_drift)
    reason = f"contents differ; statistics within tolerance (drift {drift:.3g})"
    return Verdict("within_tolerance", "tolerance", reason, drift, rel_drift)


def stat_drift(sa: dict[str, Any], sb: dict[str, Any]) -> tuple[float | None, float | None]:
    """Largest absolute and relative ``|b_s - a_s|`` over the ``TOLERANCE_STATS`` both have."""
    shared = [s for s in TOLERANCE_STATS if _number(sa.get(s)) and _number(sb.get(s))]
    if not shared:
        return None, None
    gaps = [(_gap(sa[s], sb[s]), abs(sa[s])) for s in shared]
    drift = max(gap for gap, _ in gaps)
    return drift, max(_relative(gap, ref) for gap, ref in gaps)


def _relative(gap: float, ref: float) -> float:
    if gap == 0:
        return 0.0
    return gap / ref if math.isfinite(gap) and ref else math.inf


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _gap(x: float, y: float) -> float:
    if math.isnan(x) or math.isnan(y):
        return 0.0 if math.isnan(x) and math.isnan(y) else math.inf
    if x == y:  # also equal infinities, whose difference is NaN
        return 0.0
    return abs(y - x)


def _close(x: float, y: float, atol: float, rtol: float) -> bool:
    gap = _gap(x, y)
    if gap == 0:
        return True
    return math.isfinite(gap) and bool(passes(gap, abs(x), atol, rtol))


def _value_reason(a: dict[str, Any], b: dict[str, Any]) -> str:
    (known_a, value_a), (known_b, value_b) = typed_value_content(a), typed_value_content(b)
    if known_a and known_b:
        return f"value {_short(value_a)} vs {_short(value_b)}"
    if REPR in a or REPR in b:
        return f"value {a.get(REPR, _short(value_a))} vs {b.get(REPR, _short(value_b))}"
    if "shape" in a or "shape" in b:
        return "a tensor in one run, a plain value in the other"
    return "state differs (hash)"


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
