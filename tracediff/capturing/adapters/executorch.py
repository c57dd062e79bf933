"""The ExecuTorch adapter: every output an ExecuTorch program's run writes to its ETDump, with its module scopes.

An ExecuTorch program (``.pte``) runs no Python modules: its method is a list of kernel calls and delegate
calls. ExecuTorch's event tracer, with a debug buffer, keeps every instruction's output; the ETRecord written
at export (``to_edge_transform_and_lower(..., generate_etrecord=True)``) maps each instruction to the debug
handle of the edge-program node it came from, and that node carries its ``nn_module_stack``. So each output
becomes one graph node (:mod:`tracediff.capturing.graph`):

* ``scope``: the node's module paths, outermost first (``["model", "model.layers.0", ...,
  "model.layers.0.self_attn.q_proj"]``); ``name``: its op's short name (``mm``, ``add``); ``op``: the edge
  op (``aten.mm.default``); ``key``: the edge program's value name; ``sources``: the values it read, followed
  through the views that ran as no instruction (a ``view_copy`` is memory planned away: a ``Linear``'s
  output is the 2-D ``mm`` before the view back to 3-D); a weight or a program input is external;
* a delegated region (XNNPACK) is not seen inside: one node per output of the delegate call, at its
  boundary, ``op`` the backend's id (``XnnpackBackend``), scoped by the edge node that produced that output,
  its attributes naming the delegate, its instruction and the scope all its ops share;
* an output without data in the debug buffer (a scalar, a type the buffer does not keep) is not recorded;
  the counts are in the metadata's ``runtime.etdump``.

The program runs once (one step) with ExecuTorch's pybinding (``executorch.runtime``). The program's inputs
are fed by name from the inputs file (``kwargs.NAME``, ``NAME`` or ``args.i``); a non-tensor input the
program was exported with (``use_cache=False``) is the value the program holds. executorch is imported only
when a program is captured.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stderr
from pathlib import Path
from typing import Any

from ...errors import UsageError
from ...files.confine import read_bounded
from ...format import sanitize_repr
from ...trace.vocabulary import GraphVocabulary
from .base import AdapterBase, Installed, Recorder, RuntimeOption
from .executorch_files import (
    EtRecord,
    ProgramFacts,
    check_program_bytes,
    check_program_file,
    import_executorch,
    program_facts,
    read_etdump,
    read_etrecord,
)
from .executorch_nodes import NodePlan

FRAMEWORK = "executorch"
_VIEWS = ("aten.view_copy.default", "aten.alias_copy.default", "aten.clone.default",
          "dim_order_ops._clone_dim_order.default", "aten.unsqueeze_copy.default", "aten.squeeze_copy.dims",
          "aten.squeeze_copy.dim", "aten.squeeze_copy.default")
VOCABULARY = GraphVocabulary(
    scopes="modules",
    views=frozenset({*_VIEWS, "aten.permute_copy.default", "aten.transpose_copy.int", "aten.expand_copy.default",
                     "aten.slice_copy.Tensor", "aten.select_copy.int"}),
    same_values=frozenset(_VIEWS))
#: Delegated ops whose backend's kernel computes another function than the op asks, by (backend, op, string
#: argument, value): the name of that approximation (tracediff.trace.vocabulary.APPROXIMATIONS), written on
#: each delegate output it acts on. XNNPACK's GELU serializes no ``approximate`` flag: where the graph asks for
#: the tanh form, it computes the exact (erf) one.
KERNEL_FORMS = {("XnnpackBackend", "aten.gelu.default", "approximate", "tanh"): "xnnpack_gelu_erf"}
_ETRECORD_HELP = ("the ETRecord written with the program (to_edge_transform_and_lower(..., "
                  "generate_etrecord=True), then get_etrecord().save(PATH)): it names each output's module")


class ExecuTorchProgram:
    """A program ready to be captured: its bytes, what they say, and its ETRecord."""

    def __init__(self, data: bytes, label: str, record: EtRecord, facts: ProgramFacts) -> None:
        self.data, self.label, self.record, self.facts = data, label, record, facts
        self.recorder: Recorder | None = None
        self.counts: dict[str, int] = {}
        self.hidden_modules: list[str] = []  # modules whose outputs the run did not show (inside a delegate)

    def feeds(self, inputs: Mapping[str, Any], source: str) -> list[Any]:
        """The method's inputs in order: a tensor by its names in ``inputs``, a non-tensor as exported."""
        import torch

        names = self.record.input_names or [f"args.{i}" for i in range(len(self.facts.constants))]
        placeholders = iter(self.record.placeholders)
        values: list[Any] = []
        for position, name in enumerate(names):
            if position in self.facts.constants:
                values.append(self.facts.constants[position])
                continue
            own = next(placeholders, None)
            bare = name.split(".", 1)[1] if name.startswith("kwargs.") else own
            keys = [key for key in (name, f"kwargs.{bare}" if bare else None, bare, f"args.{position}") if key]
            found = next((key for key in keys if key in inputs), None)
            if found is None:
                shown = bare or name
                raise UsageError(f"{source}: program input {shown!r} is not in the file (it holds "
                                 f"{', '.join(sorted(inputs)) or 'nothing'})")
            value = inputs[found]
            if not isinstance(value, torch.Tensor):
                value = torch.as_tensor(value)
            values.append(value.contiguous())
        return values

    def buffer_size(self) -> int:
        """Debug buffer bytes: every node output twice over (a delegate's inputs are logged again, and each
        entry is aligned), at least 1 MiB."""
        return max(1 << 20, 2 * self.record.tensor_bytes + 128 * len(self.record.nodes))


class _Recording:
    def __init__(self, model: ExecuTorchProgram, recorder: Recorder) -> None:
        self._model = model
        model.recorder = recorder

    def restore(self) -> None:
        self._model.recorder = None


class ExecuTorchAdapter(AdapterBase):
    """ExecuTorch programs (``.pte`` with their ETRecord): every output of a run's ETDump, with its modules."""

    framework = FRAMEWORK
    models = "ExecuTorch"
    supported_options: frozenset[str] = frozenset()
    graph = VOCABULARY
    file_kind = "an ExecuTorch program (.pte, with --etrecord)"
    options = (RuntimeOption("etrecord", kind="path", metavar="ETRECORD", help=_ETRECORD_HELP),)

    def recognises(self, model: Any) -> bool:
        if isinstance(model, ExecuTorchProgram):
            return True
        manager = getattr(sys.modules.get("executorch.exir"), "ExecutorchProgramManager", None)
        if isinstance(manager, type) and isinstance(model, manager):
            return True
        return isinstance(model, (bytes, bytearray)) and model[4:6] == b"ET" and model[6:8].isdigit()

    def version(self) -> str | None:
        return executorch_version()

    def opens(self, path: Path) -> bool:
        return path.suffix.lower() == ".pte"

    def load(self, source: Any, options: Mapping[str, Any]) -> ExecuTorchProgram:
        """An ``ExecuTorchProgram`` of ``source``: a ``.pte`` file (a Path), the bytes of one, or an
        ``executorch.exir.ExecutorchProgramManager`` (``to_edge_transform_and_lower(...).to_executorch()``).

        ``options``: ``etrecord``, the ETRecord file (required, except for a manager made with
        ``generate_etrecord=True``, whose own ETRecord is used). Raises UsageError for a program file that is
        a link, no regular file, or no ExecuTorch program; an ETRecord that is no zip of an edge program, or
        not this program's; executorch not installed.
        """
        if isinstance(source, ExecuTorchProgram):
            return source
        etrecord = options.get("etrecord")
        import_executorch()
        if isinstance(source, (str, Path)):
            label = str(source)
            data = check_program_file(Path(source))
        elif isinstance(source, (bytes, bytearray)):
            label, data = "program", bytes(source)
            check_program_bytes(data, label)
        else:
            label, data = "program", bytes(source.buffer)
            if etrecord is None:
                return self._with_own_etrecord(source, data)
        if etrecord is None:
            raise UsageError(f"{label}: an ExecuTorch program is captured with its ETRecord (--etrecord FILE, "
                             f"options={{'etrecord': FILE}}): {_ETRECORD_HELP}")
        return _prepared(data, label, read_etrecord(Path(etrecord)))

    def _with_own_etrecord(self, manager: Any, data: bytes) -> ExecuTorchProgram:
        try:
            own = manager.get_etrecord()
        except Exception as e:  # noqa: BLE001 - a manager made without generate_etrecord raises
            raise UsageError(f"program: it holds no ETRecord ({_first_line(e)}): export with generate_etrecord=True "
                             "or give options={'etrecord': FILE}") from None
        with tempfile.TemporaryDirectory(prefix="tracediff-etrecord-") as folder:
            path = Path(folder) / "etrecord.bin"
            own.save(str(path))
            return _prepared(data, "program", read_etrecord(path))

    def check_run(self, model: Any, inputs: Mapping[str, Any], source: str = "inputs") -> None:
        """UsageError when ``inputs`` lack one of the program's tensor inputs (named as the file names it)."""
        self._loaded(model).feeds(inputs, source)

    def install(self, model: Any, recorder: Recorder, options: Mapping[str, Any]) -> Installed:
        return _Recording(self._loaded(model), recorder)

    def run_inputs(self, model: Any, inputs: Mapping[str, Any]) -> None:
        """Run the method once on ``inputs`` with ETDump and a debug buffer; record its outputs as one step."""
        loaded = self._loaded(model)
        values = loaded.feeds(inputs, "inputs")
        etdump, buffer = run_with_etdump(loaded, values)
        outputs = read_etdump(etdump, buffer)
        recorder = loaded.recorder
        if recorder is None:
            return
        plan = NodePlan(loaded.record, outputs, VOCABULARY.views, loaded.facts.delegate_calls, KERNEL_FORMS)
        nodes = plan.nodes()
        loaded.counts, loaded.hidden_modules = plan.counts, plan.hidden_modules
        recorder.begin_step()
        for node in nodes:
            recorder.record_node(key=node.key, name=node.name, op=node.op, scope=list(node.scopes) or None,
                                 output=node.data, sources=list(node.sources), attributes=node.attributes)
        recorder.end_step()

    def host(self, value: Any) -> Any:
        return value

    def metadata(self, model: Any) -> dict[str, Any]:
        if not isinstance(model, ExecuTorchProgram):
            return {"model_class": type(model).__name__, "runtime": {}}
        return {"model_class": model.record.root_class or "ExecuTorchProgram", "runtime": runtime_facts(model)}

    def _loaded(self, model: Any) -> ExecuTorchProgram:
        if isinstance(model, ExecuTorchProgram):
            return model
        raise UsageError(f"model: a {type(model).__name__} is captured with tracediff.capture_file(program, out, "
                         "inputs=..., options={'etrecord': FILE}), which loads it into ExecuTorch")


def _prepared(data: bytes, label: str, record: EtRecord) -> ExecuTorchProgram:
    facts = program_facts(data, label, record.method)
    mapped = len(record.handles)
    if mapped != facts.instructions:
        raise UsageError(f"{record.label}: not the ETRecord of {label} (it maps {mapped} instructions, the "
                         f"program's method {record.method!r} has {facts.instructions})")
    return ExecuTorchProgram(data, label, record, facts)


class _NativeLog:
    """What ExecuTorch's C++ runtime wrote to the process's stderr while it loaded and ran the program."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def first(self) -> str:
        """``" ([method.cpp:602] ...)"``: its first line, for the one line a refusal prints; empty when none."""
        try:
            lines = self._path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return f" ({sanitize_repr(lines[0])[:200]})" if lines else ""


@contextmanager
def _native_log() -> Iterator[_NativeLog]:
    """Send standard error (its file descriptor and ``sys.stderr``) to a temporary file for the block: the
    runtime logs a failing load there in several lines, and a refusal is one line."""
    sys.stderr.flush()
    with tempfile.TemporaryDirectory(prefix="tracediff-executorch-log-") as folder:
        path = Path(folder) / "stderr.txt"
        saved = os.dup(2)
        try:
            with open(path, "w", encoding="utf-8", errors="replace") as sink, redirect_stderr(sink):
                os.dup2(sink.fileno(), 2)  # the C++ log, and its Python binding's, which writes to sys.stderr
                try:
                    yield _NativeLog(path)
                finally:
                    sink.flush()
                    os.dup2(saved, 2)
        finally:
            os.close(saved)


def run_with_etdump(model: ExecuTorchProgram, values: Sequence[Any]) -> tuple[bytes, bytes]:
    """Run the method once with the event tracer and a debug buffer; the ETDump and the buffer's bytes."""
    runtime = import_executorch()
    size = model.buffer_size()
    with _native_log() as log:
        try:
            program = runtime.Runtime.get().load_program(model.data, enable_etdump=True, debug_buffer_size=size)
            method = program.load_method(model.record.method)
        except Exception as e:  # noqa: BLE001 - the runtime's errors for a program it cannot load
            raise UsageError(f"{model.label}: ExecuTorch could not load it: {_first_line(e)}{log.first()}") from None
        try:
            method.execute(list(values))
        except Exception as e:  # noqa: BLE001 - a shape or dtype the program does not take
            raise UsageError(f"{model.label}: ExecuTorch failed to run it on the inputs: {_first_line(e)}"
                             f"{log.first()}") from None
    with tempfile.TemporaryDirectory(prefix="tracediff-etdump-") as folder:
        etdump, buffer = Path(folder) / "run.etdp", Path(folder) / "debug.bin"
        program.write_etdump_result_to_file(str(etdump), str(buffer))
        return (read_bounded(etdump, limit=1 << 34, error=UsageError, what="ETDump"),
                read_bounded(buffer, limit=size, error=UsageError, what="debug buffer"))


def runtime_facts(model: ExecuTorchProgram) -> dict[str, Any]:
    """The trace metadata's ``runtime``: ExecuTorch's version, the kernels and delegates that ran, the exporter."""
    delegates: dict[str, int] = {}
    for backend in model.record.delegates.values():
        delegates[backend] = delegates.get(backend, 0) + 1
    kernels = (["portable"] if len(model.record.delegates) < model.facts.instructions else []) + \
        sorted({backend.removesuffix("Backend").lower() for backend in delegates})
    return {"runtime": "executorch", "executorch_version": executorch_version(),
            "program": Path(model.label).name, "etrecord": Path(model.record.label).name,
            "method": model.record.method, "kernels": kernels, "delegates": delegates,
            "operators": list(model.facts.operators), "instructions": model.facts.instructions,
            "exporter": {"name": "torch.export + executorch.exir", "export_schema": model.record.schema},
            "precision": "as exported (the program's own dtypes)", "etdump": dict(model.counts),
            "modules_not_shown": list(model.hidden_modules),
            "debug_buffer_bytes": model.buffer_size()}


def executorch_version() -> str | None:
    """The version executorch says it is (``1.5.1+cpu``), without importing it when it is not imported."""
    imported = getattr(sys.modules.get("executorch.version"), "__version__", None)
    if imported is not None:
        return str(imported)
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("executorch")
    except PackageNotFoundError:
        return None


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(e).__name__


__all__ = ["FRAMEWORK", "VOCABULARY", "ExecuTorchAdapter", "ExecuTorchProgram", "run_with_etdump"]
