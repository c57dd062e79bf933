"""Which (atol, rtol) applies to a tensor pair.

Defaults follow ``torch.testing.assert_close`` per dtype, taking the less
precise dtype of the pair:

==================  =========  =========
dtype               atol       rtol
==================  =========  =========
float64             1e-7       1e-7
float32             1e-5       1.3e-6
float16             1e-5       1e-3
bfloat16            1e-5       1.6e-2
float8 e4m3         1e-3       1.25e-1
float8 e5m2         1e-3       2.5e-1
integers, bool      0          0
==================  =========  =========

Every function here takes and returns the pair in one order, ``(atol, rtol)``,
as ``align(atol=..., rtol=...)`` and ``--atol``/``--rtol`` name them.

(float8 has no torch.testing default; we use one unit in the last place.)

Overrides: a number applies everywhere; a mapping applies per module-path
pattern, ``{"*": 1e-5, "layers.*.mlp": 1e-4}``. A pattern is a shell-style
glob over the path relative to the root (``layers.0.mlp``) and covers that
module and everything inside it; when several match, the one given last wins.
Patterns that match no module are reported as warnings, with the closest
module paths as suggestions.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from ..errors import UsageError
from ..globs import covers

_DEFAULTS: dict[str, tuple[float, float]] = {  # (atol, rtol)
    "torch.float64": (1e-7, 1e-7),
    "torch.float32": (1e-5, 1.3e-6),
    "torch.float16": (1e-5, 1e-3),
    "torch.bfloat16": (1e-5, 1.6e-2),
    "torch.float8_e4m3fn": (1e-3, 1.25e-1),
    "torch.float8_e4m3fnuz": (1e-3, 1.25e-1),
    "torch.float8_e5m2": (1e-3, 2.5e-1),
    "torch.float8_e5m2fnuz": (1e-3, 2.5e-1),
    "torch.complex128": (1e-7, 1e-7),
    "torch.complex64": (1e-5, 1.3e-6),
}

Tolerance = float | Mapping[str, float] | None


@lru_cache(maxsize=256)  # called once per compared pair, with a handful of distinct dtypes
def default_tolerance(dtype_a: str | None, dtype_b: str | None) -> tuple[float, float]:
    """``(atol, rtol)`` for a pair: the looser of the two dtypes' torch.testing defaults."""
    pairs = [_DEFAULTS.get(d or "", (0.0, 0.0)) for d in (dtype_a, dtype_b)]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def computed_dtype(dtype: str | None, computed: str | None) -> str | None:
    """A tensor's ``dtype`` as its side computed it: ``computed`` (a trace's ``compute_dtype``) for a floating
    tensor, else its own."""
    return computed if computed is not None and (dtype or "").startswith(("torch.float", "torch.bfloat")) else dtype


def _normalize(value: Tolerance, name: str) -> tuple[float | None, list[tuple[str, float]]]:
    if value is None:
        return None, []
    if isinstance(value, (int, float)):
        return _check(float(value), name, "*"), []
    if isinstance(value, Mapping):
        rules = [(str(pattern), _check(float(v), name, pattern)) for pattern, v in value.items()]
        default = next((v for p, v in reversed(rules) if p in ("*", "")), None)
        return default, [(p, v) for p, v in rules if p not in ("*", "")]
    raise UsageError(f"{name}={value!r}: expected a number or a mapping of module-path pattern to number")


def _check(value: float, name: str, pattern: str) -> float:
    if not value >= 0:
        raise UsageError(f"{name} for {pattern!r} is {value}: tolerances must be >= 0")
    return value


def parse_cli_tolerances(values: Iterable[str] | None, name: str) -> Tolerance:
    """``["1e-5", "layers.*.mlp=1e-4"]`` -> ``{"*": 1e-5, "layers.*.mlp": 1e-4}``."""
    out: dict[str, float] = {}
    for text in values or []:
        pattern, sep, number = text.rpartition("=")
        key = pattern if sep else "*"
        try:
            out[key] = float(number)
        except ValueError:
            raise UsageError(f"--{name} {text!r}: expected a number or PATTERN=NUMBER") from None
        if sep and not pattern:
            raise UsageError(f"--{name} {text!r}: the pattern before '=' is empty")
    if not out:
        return None
    return out["*"] if list(out) == ["*"] else out


def _covers(pattern: str, path: str) -> bool:
    return covers(pattern, path)


@dataclass
class TolerancePolicy:
    """Resolves the tolerance of each pair and remembers which patterns were used."""

    atol: Tolerance = None
    rtol: Tolerance = None
    #: the dtype each side computed in, where its tensors do not show it (a trace's ``compute_dtype``): a floating
    #: tensor of that side is judged at that dtype's default tolerance
    computed_a: str | None = None
    computed_b: str | None = None
    _atol_default: float | None = field(init=False)
    _rtol_default: float | None = field(init=False)
    _atol_rules: list[tuple[str, float]] = field(init=False)
    _rtol_rules: list[tuple[str, float]] = field(init=False)
    _used: set[str] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self._atol_default, self._atol_rules = _normalize(self.atol, "atol")
        self._rtol_default, self._rtol_rules = _normalize(self.rtol, "rtol")

    def _pick(self, rules: list[tuple[str, float]], paths: tuple[str, ...]) -> float | None:
        for pattern, value in reversed(rules):
            if any(_covers(pattern, p) for p in paths):
                self._used.add(pattern)
                return value
        return None

    def resolve(self, paths: tuple[str, ...], dtype_a: str | None, dtype_b: str | None) -> tuple[float, float]:
        """``(atol, rtol)`` for a pair whose module paths (relative, both sides) are ``paths``."""
        atol_default, rtol_default = default_tolerance(computed_dtype(dtype_a, self.computed_a),
                                                       computed_dtype(dtype_b, self.computed_b))
        atol = self._pick(self._atol_rules, paths) if self._atol_rules else None
        rtol = self._pick(self._rtol_rules, paths) if self._rtol_rules else None
        atol = atol if atol is not None else self._atol_default
        rtol = rtol if rtol is not None else self._rtol_default
        return (atol_default if atol is None else atol, rtol_default if rtol is None else rtol)

    def unused_pattern_warnings(self, known_paths: Iterable[str]) -> list[str]:
        """One warning per pattern that matched no module, with did-you-mean suggestions."""
        unused = [(name, pattern) for name, rules in (("atol", self._atol_rules), ("rtol", self._rtol_rules))
                  for pattern, _ in rules if pattern not in self._used]
        if not unused:  # the usual case: ``known_paths`` (every call of both traces) is never walked
            return []
        known = sorted(set(known_paths))
        warnings = []
        for name, pattern in unused:
            if any(_covers(pattern, p) for p in known):
                continue
            close = difflib.get_close_matches(pattern, known, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            warnings.append(f"--{name} pattern {pattern!r} matches no module{hint}")
        return warnings
