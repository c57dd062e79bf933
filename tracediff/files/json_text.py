"""Indented JSON text, the same as ``json.dumps(obj, indent=...)``, built faster.

The standard library indents JSON in pure Python, through generators; a
trace tree is large enough for that to show next to a forward pass. Here the
containers are walked in Python, but every container of plain scalars (most
of a trace: statistics, tensor descriptions) is formatted by the standard
library's encoder (``json.JSONEncoder`` without ``indent``, which runs in C),
with the indentation put in its item separator.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from json.encoder import encode_basestring_ascii as _quote
from typing import Any


def json_text(obj: Any, *, indent: int | None = 2, drop_key: str | None = None,
              drop_where: Callable[[dict[Any, Any]], bool] | None = None) -> str:
    """The text of ``json.dumps(obj, indent=indent)``, about twice as fast for a trace tree.

    ``drop_key`` leaves out every dict item with that key, at any depth, as if
    it had been deleted from a copy first; with ``drop_where``, only from the
    dicts for which ``drop_where(d)`` is true (a trace's SUMMARY file drops
    ``"value"`` from tensor entries only). Values this does not know, and
    circular references, go to ``json.dumps``, which raises as usual.
    """
    if indent is None or not isinstance(indent, int):
        return json.dumps(_without_key(obj, drop_key, drop_where), indent=indent, allow_nan=True)
    try:
        return _IndentedJson(indent, drop_key, drop_where=drop_where).text(obj)
    except (_NotPlainJson, RecursionError):
        return json.dumps(_without_key(obj, drop_key, drop_where), indent=indent, allow_nan=True)


def _without_key(value: Any, key: str | None, where: Callable[[dict[Any, Any]], bool] | None = None) -> Any:
    if key is None:
        return value
    if isinstance(value, dict):
        drop = where is None or where(value)
        return {k: _without_key(v, key, where) for k, v in value.items() if not (drop and k == key)}
    if isinstance(value, (list, tuple)):
        return [_without_key(v, key, where) for v in value]
    return value


class _NotPlainJson(Exception):
    pass


_PLAIN_SCALARS = frozenset({str, int, float, bool, type(None)})
_CACHED_ITEMS = 3
_STR = frozenset({str})


def _float_text(value: float) -> str:
    if value != value:
        return "NaN"
    if value == math.inf:
        return "Infinity"
    if value == -math.inf:
        return "-Infinity"
    return float.__repr__(value)


def _scalar_text(value: Any) -> str | None:
    """JSON of a str/None/bool/int/float, as the standard encoder writes it; None for anything else."""
    if isinstance(value, str):
        return _quote(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return _float_text(value)
    return None


def _key_text(key: Any) -> str:
    if isinstance(key, str):
        return _quote(key)
    if isinstance(key, (bool, int, float)) or key is None:
        return '"' + str(_scalar_text(key)) + '"'
    raise _NotPlainJson


class _IndentedJson:
    def __init__(self, indent: int, drop_key: str | None, *,
                 drop_where: Callable[[dict[Any, Any]], bool] | None = None) -> None:
        self.parts: list[str] = []
        self.step = " " * indent
        self.drop_key = drop_key
        self.drop_where = drop_where
        self.newlines = ["\n"]  # newline plus the indentation of each depth
        self.flat_encoders: list[Callable[[Any], str]] = []  # encoders whose item separator indents one depth
        self.flat_texts: dict[Any, str] = {}  # small flat containers already formatted (see _flat)

    def text(self, obj: Any) -> str:
        self._value(obj, 0)
        return "".join(self.parts)

    def _value(self, value: Any, depth: int) -> None:
        add = self.parts.append
        if isinstance(value, dict):
            if not value:
                add("{}")
                return
            drop = self.drop_key
            if drop is not None and self.drop_where is not None and drop in value and not self.drop_where(value):
                drop = None
            # Checks written as set.issuperset(map(type, ...)) run in C, with no Python loop.
            if (_PLAIN_SCALARS.issuperset(map(type, value.values())) and _STR.issuperset(map(type, value))
                    and (drop is None or drop not in value)):
                add(self._flat(value, depth, "{", "}"))
                return
            inner = self._newline(depth + 1)
            separator = "{" + inner
            for key, item in value.items():
                if key == drop and type(key) is str:
                    continue
                kind = type(item)  # exact types first: the common case, and cheaper than isinstance
                if kind is str:
                    add(separator + _key_text(key) + ": " + _quote(item))
                elif kind is float:
                    add(separator + _key_text(key) + ": " + _float_text(item))
                elif kind is int:
                    add(separator + _key_text(key) + ": " + int.__repr__(item))
                else:
                    text = _scalar_text(item)
                    add(separator + _key_text(key) + ": " + (text or ""))
                    if text is None:
                        self._value(item, depth + 1)
                separator = "," + inner
            add("{}" if separator[0] == "{" else self.newlines[depth] + "}")  # "{}" when every key was dropped
        elif isinstance(value, (list, tuple)):
            if not value:
                add("[]")
                return
            if _PLAIN_SCALARS.issuperset(map(type, value)):
                add(self._flat(value, depth, "[", "]"))
                return
            inner = self._newline(depth + 1)
            separator = "[" + inner
            for item in value:
                text = _scalar_text(item)
                add(separator + (text or ""))
                if text is None:
                    self._value(item, depth + 1)
                separator = "," + inner
            add(self.newlines[depth] + "]")
        else:
            text = _scalar_text(value)
            if text is None:
                raise _NotPlainJson
            add(text)

    def _flat(self, value: Any, depth: int, opening: str, closing: str) -> str:
        """A non-empty container of plain scalars, formatted by the standard encoder, one item per line.

        A small one without floats (``{"numel": 1}``, a typed ``True``) is formatted once per depth: a long
        generation repeats them in every step. Its types are in the key (``True == 1``); floats are not
        cached (``-0.0 == 0.0``).
        """
        key = None
        if len(value) <= _CACHED_ITEMS:
            types = tuple(map(type, value.values() if opening == "{" else value))
            if float not in types:
                key = (depth, opening, tuple(value.items()) if opening == "{" else tuple(value), types)
                text = self.flat_texts.get(key)
                if text is not None:
                    return text
        text = self._encode_flat(value, depth, opening, closing)
        if key is not None:
            self.flat_texts[key] = text
        return text

    def _encode_flat(self, value: Any, depth: int, opening: str, closing: str) -> str:
        while len(self.flat_encoders) <= depth:
            inner = self._newline(len(self.flat_encoders) + 1)
            encoder = json.JSONEncoder(separators=("," + inner, ": "), check_circular=False)
            self.flat_encoders.append(encoder.encode)
        body = self.flat_encoders[depth](value)
        return opening + self.newlines[depth + 1] + body[1:-1] + self.newlines[depth] + closing

    def _newline(self, depth: int) -> str:
        while len(self.newlines) <= depth:
            self.newlines.append(self.newlines[-1] + self.step)
        return self.newlines[depth]


class _IndentedJsonPair(_IndentedJson):
    """Both texts of ``json_text_pair`` in one walk: the whole text in ``parts``, the stripped one in ``stripped``.

    The two differ only inside the dicts that lose ``drop_key``; everything else (nearly all of a trace
    tree: its statistics) is formatted once and shared.
    """

    def __init__(self, indent: int, drop_key: str, drop_where: Callable[[dict[Any, Any]], bool] | None,
                 repeated: Callable[[dict[Any, Any]], bool] | None = None) -> None:
        super().__init__(indent, drop_key, drop_where=drop_where)
        self.key = drop_key  # drop_key, never None here
        self.stripped: list[str] = []
        self.dropped = False  # some dict lost the key: the texts differ
        self.repeated = repeated
        # id of a ``repeated`` dict -> (its depth, whole text, stripped text): the objects live through the walk
        self.texts_of: dict[int, tuple[int, str, str]] = {}
        self._whole = _IndentedJson(indent, None)  # the dropped values, which only the whole text holds
        self._whole.parts, self._whole.newlines, self._whole.flat_encoders, self._whole.flat_texts = (
            self.parts, self.newlines, self.flat_encoders, self.flat_texts)

    def texts(self, obj: Any) -> tuple[str, str]:
        self._value(obj, 0)
        text = "".join(self.parts)
        return text, "".join(self.stripped) if self.dropped else text

    def _value(self, value: Any, depth: int) -> None:
        if self.repeated is not None and type(value) is dict and value and self.repeated(value):
            self._repeated(value, depth)
            return
        self._walk(value, depth)

    def _repeated(self, value: dict[Any, Any], depth: int) -> None:
        """A dict that may appear again (one tensor entry read by several calls): walked once, its texts kept
        and written again, re-indented to the depth it appears at (JSON strings hold no raw newline, so every
        newline of the text is its own indentation)."""
        known = self.texts_of.get(id(value))
        if known is not None:
            was, whole, stripped = known
            if was != depth:
                old, new = self._newline(was), self._newline(depth)
                whole, stripped = whole.replace(old, new), stripped.replace(old, new)
            self.parts.append(whole)
            self.stripped.append(stripped)
            return
        start, start_stripped = len(self.parts), len(self.stripped)
        self._walk(value, depth)
        whole, stripped = "".join(self.parts[start:]), "".join(self.stripped[start_stripped:])
        self.parts[start:] = [whole]
        self.stripped[start_stripped:] = [stripped]
        self.texts_of[id(value)] = (depth, whole, stripped)

    def _walk(self, value: Any, depth: int) -> None:
        add, add_stripped = self.parts.append, self.stripped.append
        if isinstance(value, dict):
            if not value:
                add("{}")
                add_stripped("{}")
                return
            drop = self.key
            if drop in value and (self.drop_where is None or self.drop_where(value)):
                self.dropped = True
                self._dict_losing_key(value, depth, drop)
                return
            if _PLAIN_SCALARS.issuperset(map(type, value.values())) and _STR.issuperset(map(type, value)):
                text = self._flat(value, depth, "{", "}")
                add(text)
                add_stripped(text)
                return
            inner = self._newline(depth + 1)
            separator = "{" + inner
            for key, item in value.items():
                kind = type(item)
                if kind is str:
                    text = separator + _key_text(key) + ": " + _quote(item)
                elif kind is float:
                    text = separator + _key_text(key) + ": " + _float_text(item)
                elif kind is int:
                    text = separator + _key_text(key) + ": " + int.__repr__(item)
                else:
                    scalar = _scalar_text(item)
                    text = separator + _key_text(key) + ": " + (scalar or "")
                    if scalar is None:
                        add(text)
                        add_stripped(text)
                        self._value(item, depth + 1)
                        separator = "," + inner
                        continue
                add(text)
                add_stripped(text)
                separator = "," + inner
            closing = self.newlines[depth] + "}"
            add(closing)
            add_stripped(closing)
        elif isinstance(value, (list, tuple)):
            if not value:
                add("[]")
                add_stripped("[]")
                return
            if _PLAIN_SCALARS.issuperset(map(type, value)):
                text = self._flat(value, depth, "[", "]")
                add(text)
                add_stripped(text)
                return
            inner = self._newline(depth + 1)
            separator = "[" + inner
            for item in value:
                scalar = _scalar_text(item)
                add(separator + (scalar or ""))
                add_stripped(separator + (scalar or ""))
                if scalar is None:
                    self._value(item, depth + 1)
                separator = "," + inner
            closing = self.newlines[depth] + "]"
            add(closing)
            add_stripped(closing)
        else:
            scalar = _scalar_text(value)
            if scalar is None:
                raise _NotPlainJson
            add(scalar)
            add_stripped(scalar)

    def _dict_losing_key(self, value: dict[Any, Any], depth: int, drop: str) -> None:
        """A dict whose ``drop`` item only the whole text has; its other values are walked for both texts."""
        add, add_stripped = self.parts.append, self.stripped.append
        inner = self._newline(depth + 1)
        separator = stripped_separator = "{" + inner
        for key, item in value.items():
            scalar = _scalar_text(item)
            line = _key_text(key) + ": " + (scalar or "")
            add(separator + line)
            separator = "," + inner
            if key == drop and type(key) is str:
                if scalar is None:
                    self._whole._value(item, depth + 1)
                continue
            add_stripped(stripped_separator + line)
            stripped_separator = "," + inner
            if scalar is None:
                self._value(item, depth + 1)
        add(self.newlines[depth] + "}")
        add_stripped("{}" if stripped_separator[0] == "{" else self.newlines[depth] + "}")


def json_text_pair(obj: Any, *, drop_key: str, indent: int | None = 2,
                   drop_where: Callable[[dict[Any, Any]], bool] | None = None,
                   repeated: Callable[[dict[Any, Any]], bool] | None = None) -> tuple[str, str]:
    """``json_text(obj)`` and ``json_text(obj, drop_key=..., drop_where=...)``, built in one walk.

    ``repeated`` names the dicts that may be the very same object in several places (a trace's tensor
    entries: one call's output is the next one's input): each is formatted once. None of them may change
    while the texts are built.
    """
    if indent is None or not isinstance(indent, int):
        return (json_text(obj, indent=indent),
                json_text(obj, indent=indent, drop_key=drop_key, drop_where=drop_where))
    try:
        return _IndentedJsonPair(indent, drop_key, drop_where, repeated).texts(obj)
    except (_NotPlainJson, RecursionError):
        return (json_text(obj, indent=indent),
                json_text(obj, indent=indent, drop_key=drop_key, drop_where=drop_where))
