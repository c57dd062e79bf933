"""Declared layouts: the ``--shards RULES`` file, for engines whose tensors are plain local shards.

One rule per line, ``#`` starts a comment::

    # module path (glob, without the root)   tensor slot: layout
    layers.*.self_attn.q_proj                 outputs: dim -1 over tp
    layers.*.self_attn.o_proj                 inputs.args.0: dim -1 over tp
    layers.*.mlp.down_proj                    outputs: partial over tp
    embed_tokens                              outputs: replicated

The slot is a recorded slot or its prefix (``outputs`` covers ``outputs.0``,
``inputs`` every input). The layout is ``dim D over NAME`` (each rank of mesh
dimension NAME holds a slice along tensor dim D, in rank order), ``partial over
NAME`` (each holds a partial sum) or ``replicated``; the mesh's other
dimensions are replicated. NAME must be a dimension of the recorded mesh; a
run without a device mesh has one dimension, which any name designates. The
first rule that matches a tensor gives its layout; a layout the trace recorded
wins over every rule. A rule that matches no tensor is refused (exit code 2).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import format as fmt
from ..errors import UsageError
from ..files.confine import read_bounded
from ..globs import matcher
from .layout import Layout, Placement

RULES_LIMIT = 1 << 20
#: The most rules a file may hold: each tensor of the trace is matched against the rules in order, and each
#: glob compiled once (a regular expression each: about 0.2 ms to compile).
RULES_COUNT_LIMIT = 1024
_RULE = re.compile(r"(?P<path>\S+)\s+(?P<slot>[^\s:]+)\s*:\s*(?P<layout>.+)")
_DIM = re.compile(r"dim\s+(-?\d{1,18})\s+over\s+(\S+)")  # a shape's dims have at most 18 digits
_PARTIAL = re.compile(r"partial\s+over\s+(\S+)")


@dataclass(frozen=True)
class ShardRule:
    line: int
    text: str
    path: str
    slot: str
    kind: str  # "S", "P" or "R"
    dim: int | None
    mesh_dim: str | None
    matches: Callable[[str], object] = field(repr=False, compare=False, default=lambda _: None)
    slot_prefix: str = field(repr=False, compare=False, default="")  # "outputs.": what a covered slot starts with


@dataclass
class ShardRules:
    """The rules of one file, and which of them matched a tensor."""

    source: str
    rules: tuple[ShardRule, ...]
    used: set[int] = field(default_factory=set)

    def layout_for(self, relative_path: str, slot: str, dim_names: tuple[str, ...]) -> Layout | None:
        """The layout of the first rule matching the call at ``relative_path`` and ``slot``, or None."""
        for rule in self.rules:
            if not (slot == rule.slot or slot.startswith(rule.slot_prefix)) or not rule.matches(relative_path):
                continue
            self.used.add(rule.line)
            placements: list[Placement] = [(fmt.REPLICATE, None)] * len(dim_names)
            if rule.kind != fmt.REPLICATE:
                placements[self._mesh_index(rule, dim_names)] = (rule.kind, rule.dim)
            return Layout(tuple(placements), "declared")
        return None

    def check_used(self) -> None:
        """Refuse a rule that matched no tensor (a typo would otherwise pass unseen)."""
        for rule in self.rules:
            if rule.line not in self.used:
                raise UsageError(f"{self.source}: line {rule.line}: rule {rule.text!r} matches no tensor")

    def _mesh_index(self, rule: ShardRule, dim_names: tuple[str, ...]) -> int:
        if rule.mesh_dim in dim_names:
            return dim_names.index(rule.mesh_dim)
        if len(dim_names) == 1 and dim_names[0] == "world":  # a run without a device mesh
            return 0
        raise UsageError(f"{self.source}: line {rule.line}: mesh dimension {rule.mesh_dim!r} is not one of the "
                         f"run's ({', '.join(dim_names)})")


def _compiled(glob: str) -> Callable[[str], object]:
    """The matcher of one glob (:mod:`tracediff.globs`: ``*`` one path segment, ``**`` any number), compiled
    once; a glob without wildcards is a plain comparison."""
    return matcher(glob)


def parse_rules(text: str, source: str) -> ShardRules:
    """The rules of ``text`` (``UsageError`` naming ``source`` and the line for one that does not parse)."""
    rules: list[ShardRule] = []
    compiled: dict[str, Callable[[str], object]] = {}  # one matcher per distinct glob
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _RULE.fullmatch(line)
        layout = match.group("layout").strip() if match else ""
        dim, partial = _DIM.fullmatch(layout), _PARTIAL.fullmatch(layout)
        if match is None or not (dim or partial or layout == "replicated"):
            shown = line if len(line) <= 80 else line[:77] + "..."
            raise UsageError(f"{source}: line {number}: expected 'PATH SLOT: dim D over NAME', 'PATH SLOT: partial "
                             f"over NAME' or 'PATH SLOT: replicated', got {shown!r}")
        kind, tensor_dim, mesh_dim = (("S", int(dim.group(1)), dim.group(2)) if dim else
                                      (fmt.PARTIAL, None, partial.group(1)) if partial else
                                      (fmt.REPLICATE, None, None))
        if len(rules) == RULES_COUNT_LIMIT:
            raise UsageError(f"{source}: holds more than {RULES_COUNT_LIMIT} rules; refused")
        glob = match.group("path")
        if glob not in compiled:
            compiled[glob] = _compiled(glob)
        rules.append(ShardRule(number, line, glob, match.group("slot"), kind, tensor_dim, mesh_dim,
                               compiled[glob], match.group("slot") + "."))
    if not rules:
        raise UsageError(f"{source}: holds no rule")
    return ShardRules(source, tuple(rules))


def read_rules(path: str | Path) -> ShardRules:
    """The rules of the file at ``path`` (read with a bound of 1 MiB)."""
    data = read_bounded(Path(path), limit=RULES_LIMIT, error=UsageError, what="shards file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: the shards file is not UTF-8") from None
    return parse_rules(text, str(path))
