"""The one stage every trace is written through: a capture's and an importer's alike.

What a trace writer decides besides the payload bytes lives here once:

* the payload file of a value (``payload_file``: its name made file-safe and unique in the trace);
* its tensor entry (``tensor_entry``: ``shape`` and ``dtype`` as torch writes them, the payload reference or
  the repr lines, statistics, device), counting the dtypes and devices the metadata lists;
* the call a scope name stands for (``scope_call``: ``layers.0.fc`` inside ``layers.0`` inside the root, made
  on first use), for writers whose source names values by scope (ONNX value names, a graph runtime's scopes);
* the tree files and the metadata (``write_tree``, ``write_metadata``), written atomically, the metadata with
  ``format_version``, the writer's version, the ``framework`` the values came from (when known) and the payload
  counts.

The capture (:class:`tracediff.capturing.encode.Encoder`) writes its payloads from tensors it holds, through
its writer threads; an importer (:mod:`tracediff.importers._writer`) copies them from the dump. Both name
them, describe them and finish the trace here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import format as fmt
from .._version import __version__
from .atomic import write_json, write_json_pair


class TraceStage:
    """One trace being written into ``folder``: names, entries, counts, and the files that finish it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files = 0  # payload files written so far
        self.payload_bytes = 0
        self.devices: set[str] = set()
        self.dtypes: set[str] = set()
        self._stems: set[str] = set()
        self._last_suffix: dict[str, int] = {}  # stem -> its latest ~k, for unique_payload_stem

    def payload_file(self, name: str) -> str:
        """``{name}.safetensors`` made file-safe; ``{name}~{k}.safetensors`` when two names sanitize alike."""
        return fmt.payload_file_name(fmt.unique_payload_stem(name, self._stems, self._last_suffix))

    def written(self, nbytes: int) -> None:
        """A payload of ``nbytes`` tensor bytes was written."""
        self.files += 1
        self.payload_bytes += nbytes

    def tensor_entry(self, shape: Sequence[int] | str, dtype: str, value: str | list[str] | None = None, *,
                     stats: dict[str, Any] | None = None, device: str = "cpu",
                     string_stats: Mapping[str, str] | None = None) -> dict[str, Any]:
        """A tensor entry; ``shape`` as sizes (or torch's repr), ``dtype`` as ``float32`` or ``torch.float32``.

        ``value`` is a payload reference (``fmt.payload_reference(self.payload_file(name))``), the repr lines,
        or None (statistics only). ``stats`` is kept as the very object given: a writer that measures later
        (on a writer thread, on a device) fills it in place.
        """
        dtype_repr = dtype if dtype.startswith("torch.") else f"torch.{dtype}"
        shape_repr = shape if isinstance(shape, str) else f"torch.Size({[int(d) for d in shape]})"
        self.dtypes.add(dtype_repr)
        self.devices.add(device)
        return fmt.tensor_entry(shape_repr, dtype_repr, value, string_stats=string_stats, stats=stats, device=device)

    def write_tree(self, tree: Mapping[str, Any], model_name: str) -> None:
        """The FULL_TENSORS file and the SUMMARY file (the same tree without the tensor entries' values)."""
        full, summary = fmt.trace_file_names(model_name)
        # a keyword argument named "value" is not a tensor entry and stays in SUMMARY; a tensor entry is one
        # object wherever the tensor was recorded again (a call's output read by the next): formatted once
        write_json_pair(self.folder / full, self.folder / summary, tree, drop_key=fmt.VALUE,
                        drop_where=fmt.is_tensor_entry, repeated=fmt.is_tensor_entry)

    def metadata(self, fields: Mapping[str, Any], *, framework: str | None = None,
                 framework_version: str | None = None) -> dict[str, Any]:
        """The metadata object of this trace: ``fields`` with the writer's version, ``framework`` (left out
        when None), the dtypes and devices recorded and the payload counts, in the format's order."""
        known: dict[str, Any] = {fmt.PRODUCER_KEY: __version__, "devices": sorted(self.devices),
                                 "dtypes": sorted(self.dtypes), "payload_files": self.files,
                                 "payload_bytes": self.payload_bytes}
        if framework is not None:
            known.update({fmt.FRAMEWORK: framework, fmt.FRAMEWORK_VERSION: framework_version})
        return fmt.metadata_entry({**known, **fields})

    def write_metadata(self, metadata: Mapping[str, Any]) -> None:
        write_json(self.folder / fmt.METADATA_FILE, dict(metadata))


def scope_call(scopes: dict[str, dict[str, Any]], scope: str, model_name: str, call_index: int) -> dict[str, Any]:
    """The call of ``scope`` (``layers.0.fc``) among ``scopes`` (``""``: the root call, given), made with its
    enclosing scopes' calls on first use and appended to its parent's ``children``.

    It has no ``module_type``: a scope name says where a value was computed, not which class did.
    """
    node = scopes.get(scope)
    if node is None:
        parent = scope_call(scopes, scope.rpartition(".")[0], model_name, call_index) if "." in scope \
            else scopes[""]
        node = scopes[scope] = fmt.node_entry(f"{model_name}.{scope}", call_index=call_index, inputs={},
                                              children=[])
        parent.setdefault(fmt.CHILDREN, []).append(node)
    return node
