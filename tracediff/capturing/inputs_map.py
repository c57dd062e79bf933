"""Feeding an inputs file saved from one implementation to another whose arguments are named differently.

``tracediff capture reference.py:build --save-inputs inputs.safetensors``
stores the reference's positional input as ``args.0``; transformers' models
take it as ``input_ids=``. ``--inputs-map 'args.0=kwargs.input_ids'`` (library:
``inputs_map={"args.0": "kwargs.input_ids"}``) says which key of the file feeds
which input of the model: ``FILE_KEY=MODEL_SLOT``, repeatable; keys not named
keep their own name. Without a map, when the keys differ and the file and
the model each hold exactly one tensor, of the same shape and dtype, that
tensor is fed and the capture says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch

from ..errors import InputsFileError, UsageError

_SLOT_KINDS = ("args.", "kwargs.")


def parse_inputs_map(items: Iterable[str] | Mapping[str, str] | None) -> dict[str, str]:
    """``["args.0=kwargs.input_ids"]`` (or a mapping) as ``{"args.0": "kwargs.input_ids"}``, validated."""
    if items is None:
        return {}
    pairs = list(items.items()) if isinstance(items, Mapping) else [_split(item) for item in items]
    out: dict[str, str] = {}
    for key, slot in pairs:
        for name in (key, slot):
            if not (isinstance(name, str) and name.startswith(_SLOT_KINDS) and len(name.split(".", 1)[1]) > 0):
                raise UsageError(f"inputs map: {name!r} is not an input slot; expected args.N or kwargs.NAME, "
                                 "e.g. 'args.0=kwargs.input_ids'")
        if key.startswith("args.") and not key[5:].isdigit() or slot.startswith("args.") and not slot[5:].isdigit():
            raise UsageError(f"inputs map: {key}={slot}: positional slots are args.N with N a number")
        if key in out:
            raise UsageError(f"inputs map: {key} is mapped twice")
        out[key] = slot
    if len(set(out.values())) != len(out):
        raise UsageError("inputs map: two keys of the file feed the same input of the model")
    return out


def _split(item: str) -> tuple[str, str]:
    key, sep, slot = item.partition("=")
    if not sep:
        raise UsageError(f"inputs map: {item!r} has no '='; expected FILE_KEY=MODEL_SLOT, "
                         "e.g. 'args.0=kwargs.input_ids'")
    return key.strip(), slot.strip()


def resolve_keys(path: object, keys: Iterable[str], slots: Mapping[str, torch.Tensor],
                 inputs_map: Mapping[str, str], load: Callable[[str], torch.Tensor]
                 ) -> tuple[dict[str, str], str | None]:
    """Which key of the file feeds each model slot, and a note when that was decided automatically.

    ``load(key)`` reads one tensor of the file (used only for the automatic
    case). Raises ``InputsFileError`` naming the file when the keys still differ.
    """
    keys = list(keys)
    renamed = {inputs_map.get(key, key): key for key in keys}
    if set(renamed) == set(slots):
        return {slot: renamed[slot] for slot in slots}, None
    if not inputs_map and len(keys) == 1 and len(slots) == 1:
        (key,), (slot, tensor) = keys, next(iter(slots.items()))
        stored = load(key)
        if stored.shape == tensor.shape and stored.dtype == tensor.dtype:
            return {slot: key}, (f"{path}: fed its only tensor {key} as {slot}, the model's only tensor input "
                                 f"(same shape and dtype); --inputs-map '{key}={slot}' says so explicitly")
    missing, unexpected = sorted(set(slots) - set(renamed)), sorted(set(renamed) - set(slots))
    hint = f"; map them with --inputs-map '{unexpected[0]}={missing[0]}'" if missing and unexpected else ""
    raise InputsFileError(f"{path}: keys do not match the model's inputs (missing: {missing or 'none'}; "
                          f"unexpected: {unexpected or 'none'}; expected: {sorted(slots)}){hint}")
