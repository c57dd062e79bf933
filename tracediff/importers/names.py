"""How the name of a tensor in a ``tensors`` dump maps to a module call and a slot.

A tensor's *name* is its file's path inside the dump folder without the
suffix, followed, for a file holding several tensors (a dict), by the keys
leading to it: ``layers/0/mlp/output`` (``layers/0/mlp/output.pt``),
``model.layers.0.mlp`` (``model.layers.0.mlp.npy``), ``layer1.npz`` holding
``input`` and ``output`` gives ``layer1/input`` and ``layer1/output``.

Without a pattern, the name is split at ``/`` and ``.`` into parts, and:

* a first part ``NNN_rest`` or ``NNN-rest`` gives the call order ``NNN``;
* a part ``call3``, ``step_3`` or ``iter3``, or a module part ending in
  ``@3``, gives the call index 3 (default 0);
* a last part ``input``/``inputs``/``output``/``outputs``, optionally with an
  index (``output_1``, ``output.1``), gives the slot (default: the outputs);
* what is left, joined by ``.``, is the module path (``layers.0.mlp``).

A pattern (``--pattern``) says it explicitly: a template over the name with
the fields ``{module}`` (``/`` read as ``.``), ``{call}``, ``{io}`` (input,
inputs, output, outputs), ``{index}``, ``{order}``, and ``*`` for any text
within one folder level, e.g. ``{order}_{module}.{io}`` or
``step{call}/{module}/{io}``. The whole name must match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import DumpFormatError, UsageError

_ORDER = re.compile(r"^(\d+)[_-](.+)$")
_CALL = re.compile(r"^(?:call|step|iter)[_-]?(\d+)$", re.IGNORECASE)
_AT = re.compile(r"^(.+)@(\d+)$")
_IO = re.compile(r"^(inputs?|outputs?)(?:[_-]?(\d+))?$", re.IGNORECASE)
_FIELDS = {"module": r"(?P<module>.+?)", "call": r"(?P<call>\d+)", "io": r"(?P<io>inputs?|outputs?)",
           "index": r"(?P<index>\d+)", "order": r"(?P<order>\d+)"}
_TOKEN = re.compile(r"\{(\w+)\}|\*")


@dataclass(frozen=True)
class Place:
    """Where one tensor goes: a module call, inputs or outputs, the position there, and the call's order if named."""

    module: str
    call: int
    io: str  # "inputs" or "outputs"
    index: int | None
    order: int | None


@dataclass(frozen=True)
class Pattern:
    """A ``--pattern`` template and its regular expression."""

    template: str
    regex: re.Pattern[str]


def compile_pattern(pattern: str) -> Pattern:
    """The compiled ``--pattern`` template (``UsageError`` for an unknown or repeated field, or no ``{module}``)."""
    parts, seen, end = [], set(), 0
    for match in _TOKEN.finditer(pattern):
        parts.append(re.escape(pattern[end:match.start()]))
        field = match.group(1)
        if field is None:
            parts.append(r"[^/]*")
        elif field not in _FIELDS:
            raise UsageError(f"--pattern {pattern!r}: unknown field {{{field}}}; the fields are "
                             + ", ".join(f"{{{f}}}" for f in _FIELDS))
        elif field in seen:
            raise UsageError(f"--pattern {pattern!r}: {{{field}}} appears twice")
        else:
            seen.add(field)
            parts.append(_FIELDS[field])
        end = match.end()
    parts.append(re.escape(pattern[end:]))
    if "module" not in seen:
        raise UsageError(f"--pattern {pattern!r}: has no {{module}} field")
    return Pattern(pattern, re.compile("".join(parts), re.IGNORECASE))


def place_of(name: str, pattern: Pattern | None, where: str) -> Place:
    """The ``Place`` of the tensor named ``name`` (``where`` names it in errors: the file, and the key)."""
    if pattern is not None:
        match = pattern.regex.fullmatch(name)
        if match is None:
            raise DumpFormatError(f"{where}: the name {name!r} does not match --pattern {pattern.template!r}")
        fields = match.groupdict()
        io = (fields.get("io") or "outputs").lower()
        module = (fields["module"] or "").replace("/", ".").strip(".")
        return _checked(Place(module, int(fields.get("call") or 0), io if io.endswith("s") else io + "s",
                              _int(fields.get("index")), _int(fields.get("order"))), where, name)
    return _checked(_default_place(name), where, name)


def _default_place(name: str) -> Place:
    parts = [p for p in re.split(r"[/.]", name) if p]
    order = None
    if parts and (match := _ORDER.match(parts[0])):
        order, parts[0] = int(match.group(1)), match.group(2)
    call = 0
    kept = []
    for part in parts:
        if match := _CALL.match(part):
            call = int(match.group(1))
        else:
            kept.append(part)
    io, index = "outputs", None
    if kept and (match := _IO.match(kept[-1])):
        io, index = match.group(1).lower(), _int(match.group(2))
        kept.pop()
    elif len(kept) >= 2 and kept[-1].isdigit() and (match := _IO.match(kept[-2])) and match.group(2) is None:
        io, index = match.group(1).lower(), int(kept[-1])
        del kept[-2:]
    if kept and (match := _AT.match(kept[-1])):
        kept[-1], call = match.group(1), int(match.group(2))
    return Place(".".join(kept), call, io if io.endswith("s") else io + "s", index, order)


def _checked(place: Place, where: str, name: str) -> Place:
    if not place.module:
        raise DumpFormatError(f"{where}: the name {name!r} names no module (only a slot or an order); "
                              "name files after module paths, or pass --pattern")
    return place


def _int(text: str | None) -> int | None:
    return int(text) if text else None
