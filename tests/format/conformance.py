"""Validating trace files against ``tracediff/trace_schema.json``.

``written_traces_conform()`` wraps the functions that write trace JSON, so
that every tree and metadata file any test writes (native capture, backward
capture, the drop-in) is validated as it is written, and every SUMMARY file
written beside a FULL_TENSORS file must be that file without the tensor
entries' values; ``tests/conftest.py`` turns it on for the whole session. A
file that does not conform fails the test that wrote it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from tracediff import format as fmt


@cache
def validator(definition: str) -> Draft202012Validator:
    """A validator for ``$defs/{definition}`` of the trace schema (``trace``, ``metadata``, ``standard_trace``)."""
    schema = fmt.schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator({"$ref": f"#/$defs/{definition}", "$defs": schema["$defs"]})


def problems(obj: Any, definition: str) -> list[str]:
    """Every schema violation of ``obj``, as ``path: message`` lines (empty when it conforms)."""
    found = sorted(validator(definition).iter_errors(obj), key=lambda e: list(e.absolute_path))
    return [f"/{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in found]


def tensor_entries(value: Any) -> Iterator[dict[str, Any]]:
    if fmt.is_tensor_entry(value):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensor_entries(item)
    elif isinstance(value, list):
        for item in value:
            yield from tensor_entries(item)


def check_tree(tree: Any, name: str, *, standard: bool) -> None:
    """Assert that ``tree``, the content of the tree file ``name``, conforms."""
    found = problems(tree, "standard_trace" if standard else "trace")
    if name.endswith(fmt.SUMMARY_SUFFIX):
        found += [f"a tensor entry of a SUMMARY file has {fmt.VALUE!r}: {entry[fmt.VALUE]!r}"
                  for entry in tensor_entries(tree) if fmt.VALUE in entry]
    assert not found, f"{name} does not conform to tracediff/trace_schema.json:\n" + "\n".join(found[:20])


def check_metadata(metadata: Any, name: str) -> None:
    found = problems(metadata, "metadata")
    assert not found, f"{name} does not conform to $defs/metadata of tracediff/trace_schema.json:\n" + "\n".join(
        found[:20])


def check_folder(folder: Path) -> int:
    """Validate every trace file in ``folder`` (recursively); the number of files checked."""
    checked = 0
    for path in sorted(folder.rglob(f"*{fmt.TREE_SUFFIX}_*.json")):
        standard = not (path.parent / fmt.METADATA_FILE).is_file()
        check_tree(json.loads(path.read_text()), str(path), standard=standard)
        checked += 1
    for path in sorted(folder.rglob(fmt.METADATA_FILE)):
        check_metadata(json.loads(path.read_text()), str(path))
        checked += 1
    return checked


_CONFORMING: set[int] = set()  # hashes of texts already validated: many tests write the same trace


def _check_written(path: Any, obj: Any, *, standard: bool) -> None:
    name = Path(path).name
    if name != fmt.METADATA_FILE and not name.endswith((fmt.FULL_SUFFIX, fmt.SUMMARY_SUFFIX)):
        return
    key = hash((name.endswith(fmt.SUMMARY_SUFFIX), standard, json.dumps(obj)))
    if key in _CONFORMING:
        return
    if name == fmt.METADATA_FILE:
        check_metadata(obj, str(path))
    else:
        check_tree(obj, str(path), standard=standard)
    _CONFORMING.add(key)


def _checked_write_json(write: Callable[..., None], *, standard: bool) -> Callable[..., None]:
    def checked(path: Any, obj: Any, *args: Any, **kwargs: Any) -> None:
        _check_written(path, obj, standard=standard)
        write(path, obj, *args, **kwargs)

    return checked


def without_tensor_values(value: Any) -> Any:
    """``value`` with ``value`` removed from every tensor entry: what a SUMMARY file must hold."""
    if isinstance(value, dict):
        tensor = fmt.is_tensor_entry(value)
        return {k: without_tensor_values(v) for k, v in value.items() if not (tensor and k == fmt.VALUE)}
    if isinstance(value, list):
        return [without_tensor_values(v) for v in value]
    return value


def _imported(path: Any) -> bool:
    """A file of a trace ``tracediff import`` writes (into a ``.{out}.{random}.importing`` staging folder).

    Not validated: an importer knows no module classes, so its calls lack ``module_type`` (a gap of the
    importers, written down in docs/importers.md)."""
    return Path(path).parent.name.endswith(".importing")


def _checked_write_json_pair(write: Callable[..., None]) -> Callable[..., None]:
    def checked(path: Any, stripped_path: Any, obj: Any, *args: Any, **kwargs: Any) -> None:
        write(path, stripped_path, obj, *args, **kwargs)
        if _imported(path):
            return
        # What was written, read back. The FULL file is validated; the SUMMARY file must be exactly the FULL
        # file without the tensor entries' values (cheaper than validating it again, and stricter).
        full = json.loads(Path(path).read_text(encoding="utf-8"))
        _check_written(path, full, standard=False)
        summary = json.loads(Path(stripped_path).read_text(encoding="utf-8"))
        assert json.dumps(summary) == json.dumps(without_tensor_values(full)), \
            f"{stripped_path} is not {Path(path).name} without the tensor entries' values"  # NaN-safe

    return checked


@contextmanager
def written_traces_conform() -> Iterator[None]:
    """Validate every trace JSON written by tracediff's capture writers while the block runs."""
    from tracediff.capturing import compat, session
    from tracediff.files import trace_writing  # the stage captures and importers write their traces through

    saved = [(module, name, getattr(module, name))
             for module, name in ((session, "write_json"), (trace_writing, "write_json"),
                                  (trace_writing, "write_json_pair"), (compat, "write_json"))]
    session.write_json = _checked_write_json(session.write_json, standard=False)  # type: ignore[attr-defined]
    trace_writing.write_json = _checked_write_json(trace_writing.write_json,  # type: ignore[attr-defined]
                                                   standard=False)
    trace_writing.write_json_pair = _checked_write_json_pair(  # type: ignore[attr-defined]
        trace_writing.write_json_pair)
    compat.write_json = _checked_write_json(compat.write_json, standard=True)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)
