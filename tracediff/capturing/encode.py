"""Turning a module's inputs and outputs into the JSON of a tracediff trace.

A tensor becomes a dict with transformers' string fields (``shape``,
``dtype``, ``value``, ``mean``, ``std``, ``min``, ``max``) plus ``stats``
(numbers, see :mod:`tracediff.capturing.stats`) and ``device``. ``value`` is
``./{name}.safetensors`` with ``tensors="full"``, the repr lines with
``"repr"``, and absent with ``"summary"``.

Lists and tuples become JSON lists and dicts (``ModelOutput`` included) and
dataclasses become JSON objects, exactly as the standard trace nests them; a
payload's file name follows the same nesting (``X_outputs_0``,
``X_outputs_last_hidden_state``). A non-tensor leaf becomes
``{"py_type": "int", "py_value": 3}`` when it is JSON-safe (None, bool, int,
float, str and lists/tuples/dicts of those, tuples stored as lists), so that
inputs can be rebuilt, and ``{"py_type": "DynamicCache", "repr": "..."}``
otherwise.

A tensor object seen again unchanged (same object, same version counter, as
when one module's output is the next one's input) is neither written nor
measured twice: its entry points to the first payload. A compiled graph's
buffer is taken for a value written before only when it holds that payload's
very bytes (:mod:`.graph_buffers`).

Payload names and tensor entries come from the stage every trace writer
shares (:class:`tracediff.files.trace_writing.TraceStage`, ``Encoder.stage``),
which also writes the tree files and the metadata when the capture ends.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch

from .. import format as fmt
from ..files.payloads import write_tensor_file
from ..files.trace_writing import TraceStage
from ..format import as_json, is_json_safe
from .compat import _tensor_lines, sanitize_repr
from .device_stats import DeviceStats, measured_on_device
from .distributed import dtensor_layout, is_dtensor
from .graph_buffers import WrittenBuffers, is_marked
from .parallel_layouts import dtensor_placements
from .pipeline import Measure, PayloadPipeline
from .stats import FLOAT_DTYPES, StatsBuffers, fill_entry_stats, placeholder_strings, string_fields, tensor_stats

TensorMode = Literal["full", "summary", "repr"]
__all__ = ["Encoder", "TensorMode", "as_json", "is_json_safe"]


def tensor_version(tensor: torch.Tensor) -> int | None:
    """The tensor's in-place version counter; None for a tensor made under ``torch.inference_mode()``, which
    keeps none (its version cannot tell whether it changed, so nothing may be reused on its account)."""
    return None if tensor.is_inference() else tensor._version


class Encoder:
    """Encodes values for one capture; keeps the payload counters and what it has seen."""

    def __init__(self, folder: Path, tensors: TensorMode, *, full_dtensor: bool = False,
                 pipeline: PayloadPipeline | None = None, measure: Callable[..., dict[str, Any]] | None = None
                 ) -> None:
        self.folder = folder
        self.measure = measure or tensor_stats  # the statistics of a host tensor (``numpy_stats`` for MLX)
        self.pipeline = pipeline  # writes payloads on writer threads; None: written here, synchronously
        self.tensors = tensors
        self.statistics = True  # False: entries of a decode step left out with other_steps="tree" (decode_steps)
        self.full_dtensor = full_dtensor
        self.stage = TraceStage(folder)  # payload names, tensor entries, and the files that finish the trace
        self.files = 0
        self.payload_bytes = 0
        self.devices: set[str] = self.stage.devices
        self.dtypes: set[str] = self.stage.dtypes
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], int | None, dict[str, Any]]] = {}
        self._graph_buffers = WrittenBuffers()  # payloads of a compiled graph's buffers
        self._stats_buffers = StatsBuffers()
        self._device_stats = DeviceStats(self._stats_buffers)
        # payloads to write once ``value`` is encoded, with the statistics the writer computes (or None)
        self._unwritten: list[tuple[Path, torch.Tensor, dict[str, Any], Measure | None]] = []

    def encode(self, value: Any, name: str) -> Any:
        """The JSON of ``value``; its payloads are written (or copied into the pipeline's pool) when this returns.

        With writer threads (``pipeline.measures``), a payload's statistics are
        computed by the writer from its host copy, and the entry is complete
        once the payload is written. Otherwise the statistics of every tensor
        in ``value`` are computed here first and the payloads written after:
        torch's worker threads, still awake from the forward, then serve all
        the statistics, instead of being woken after each file write.
        """
        try:
            encoded = self._encode(value, name)
            while self._unwritten:
                path, tensor, _, measure = self._unwritten[0]
                if self.pipeline is None:
                    self.payload_bytes += write_tensor_file(path, tensor)
                elif measure is None:
                    self.payload_bytes += self.pipeline.submit(path, tensor)
                else:
                    self.payload_bytes += self.pipeline.submit(path, tensor, measure)
                self.files += 1
                del self._unwritten[0]
        except BaseException:
            unwritten = {id(entry) for _, _, entry, _ in self._unwritten}
            for key in [k for k, seen in self._seen.items() if id(seen[2]) in unwritten]:
                del self._seen[key]  # never point a later tensor to a payload that was not written
            self._graph_buffers.clear()
            self._unwritten.clear()
            raise
        return encoded

    def forget_seen(self) -> None:
        """Encode tensors seen so far anew from here on (a new decode step: its payloads are kept or not apart)."""
        self._seen.clear()
        self._graph_buffers.clear()

    def _encode(self, value: Any, name: str) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value, name)
        if is_json_safe(value):
            return fmt.typed_value(value)
        if isinstance(value, (list, tuple)):
            return [self._encode(item, fmt.payload_name(name, i)) for i, item in enumerate(value)]
        if isinstance(value, dict):
            return {str(key): self._encode(item, fmt.payload_name(name, key)) for key, item in value.items()}
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            return {key: self._encode(item, fmt.payload_name(name, key)) for key, item in fields.items()}
        return fmt.typed_repr(type(value).__name__, sanitize_repr(repr(value)))

    def _tensor(self, value: torch.Tensor, name: str) -> dict[str, Any]:
        seen = self._seen.get(id(value))
        version = tensor_version(value)
        if seen is not None and seen[0]() is value and version is not None and seen[1] == version:
            return seen[2]
        layout = placements = None
        tensor = value
        if is_dtensor(value):
            layout = dtensor_layout(value, full=self.full_dtensor)
            placements = dtensor_placements(value, full=self.full_dtensor)
            dtensor: Any = value  # a DTensor: torch's stubs do not know it is a Tensor subclass
            tensor = dtensor.full_tensor() if self.full_dtensor else dtensor._local_tensor
        tensor = tensor.detach()
        graph_buffer = is_marked(value) and layout is None and self._payloads_comparable()
        if graph_buffer:
            pipeline = self.pipeline
            earlier = self._graph_buffers.entry_for(
                tensor, pipeline.pending_copy if isinstance(pipeline, PayloadPipeline) else None)
            if earlier is not None:
                return earlier
        entry = self._describe(tensor, name)
        if graph_buffer and self._unwritten and self._unwritten[-1][2] is entry:
            self._graph_buffers.remember(tensor, entry, self._unwritten[-1][0])
        if layout is not None:
            entry[fmt.DTENSOR] = layout
        if placements is not None:
            entry[fmt.LAYOUT] = placements
        key = id(value)

        def forget(_ref: weakref.ref[torch.Tensor], key: int = key) -> None:
            self._seen.pop(key, None)

        self._seen[key] = (weakref.ref(value, forget), version, entry)
        return entry

    def _payloads_comparable(self) -> bool:
        """True when each payload's bytes can be read back once ``encode`` returns, from its file or from the
        writer thread's copy: ``tensors="full"``, and no decode step holding its payloads until it is known
        whether they are kept."""
        pipeline = self.pipeline
        return self.tensors == "full" and (pipeline is None or isinstance(pipeline, PayloadPipeline))

    def _measure(self, tensor: torch.Tensor, on_device: bool) -> dict[str, Any]:
        """The statistics of a host tensor now; an empty dict for a device tensor, filled in later."""
        return {} if on_device else self.measure(tensor, buffers=self._stats_buffers)

    def when_complete(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the entries encoded so far are complete: payloads on disk, statistics known.

        It may run on a payload writer thread, or later on this one (device statistics are read back in
        batches), or now.
        """
        def payloads_written() -> None:
            self._device_stats.after_resolved(callback)

        if self.pipeline is not None:
            self.pipeline.after_written(payloads_written)
        else:
            payloads_written()

    def resolve_stats(self) -> None:
        """Read back the statistics still pending on devices (the entries are complete afterwards)."""
        self._device_stats.resolve()

    def _describe(self, tensor: torch.Tensor, name: str) -> dict[str, Any]:
        dtype = tensor.dtype
        device = str(tensor.device)
        full = self.tensors == "full"
        if not (full or self.statistics):  # shape, dtype, device and numel only: nothing measured
            return self.stage.tensor_entry(repr(tensor.shape), repr(dtype), stats={"numel": tensor.numel()},
                                           device=device)
        # Measured later: by the payload's writer thread (or a held decode step's write), or on the device and
        # filled in by resolve_stats().
        by_writer = full and bool(getattr(self.pipeline, "measures", False))
        on_device = not by_writer and measured_on_device(tensor)
        stored: str | list[str] | None = None
        if full:
            tensor = tensor.contiguous()  # one copy at most, shared by the payload and the statistics
            file_name = self.stage.payload_file(name)
            stored = fmt.payload_reference(file_name)
        elif self.tensors == "repr":
            stored = _tensor_lines(tensor)
        stats = {} if by_writer else self._measure(tensor, on_device)
        strings = placeholder_strings(tensor) if by_writer or on_device else \
            string_fields(stats, dtype) if dtype in FLOAT_DTYPES and stats.get("numel") else None
        entry = self.stage.tensor_entry(repr(tensor.shape), repr(dtype), stored, string_stats=strings, stats=stats,
                                        device=device)
        if on_device:
            self._device_stats.launch(tensor, entry, stats)
        if full:
            measure = _filling(entry, stats, dtype, self.measure) if by_writer else None
            self._unwritten.append((self.folder / file_name, tensor, entry, measure))
        return entry


def _filling(entry: dict[str, Any], stats: dict[str, Any], dtype: torch.dtype,
             statistics: Callable[..., dict[str, Any]]) -> Measure:
    """What the writer thread runs on a payload's host copy: its statistics, into its entry."""
    def measure(host: torch.Tensor, buffers: StatsBuffers) -> None:
        fill_entry_stats(entry, stats, statistics(host, buffers=buffers), dtype)
    return measure
