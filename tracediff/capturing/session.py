"""The native capture: ``tracediff.capture``.

Record every module call of a forward pass::

    import tracediff

    with tracediff.capture(model, "traces/hf") as session:
        model(input_ids)
    print(session.trace_dir, session.complete)

The folder then holds a standard trace (``{Model}_debug_tree_FULL_TENSORS.json``,
``..._SUMMARY.json``, one safetensors file per tensor) that transformers'
tools can read, with what the standard trace loses put back:

* every node has ``call_index`` and ``module_type``; the second call of a
  module writes ``{path}@1_...`` files instead of overwriting the first;
* parent modules keep their outputs (``prune_layers=False`` keeps every layer);
* every tensor has numeric ``stats`` and nothing is written or measured twice;
* non-tensor arguments are typed JSON values where possible;
* ``tracediff_metadata.json`` records versions, devices, dtypes, ranks,
  options, and whether the trace is complete.

An ``mlx.nn.Module`` or a ``flax.nnx.Module`` is captured the same way, into
the same trace (the metadata's ``framework`` says which), and so is any
runtime registered with ``register_adapter``: the capture chooses one adapter
(:mod:`tracediff.capturing.adapters`) for the model and asks it alone what the
model supports. See docs/frameworks.md; op-level capture, backward, ``verify``
and the ``generate`` options are for torch models only.

The model's outputs and autograd are untouched. If the forward raises, the
trace recorded so far is written, marked incomplete with the module that
raised, and the exception propagates. ``verify=True`` reruns the first
top-level call without capture on exit and checks that the outputs are
bit-identical (see ``CaptureSession.verification``).
"""

from __future__ import annotations

import datetime as _dt
import platform
import random
import sys
import warnings
from collections import defaultdict
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from .. import format as fmt
from .._version import __version__
from ..display import short_repr, summary_html
from ..errors import TracediffError
from ..files.atomic import ensure_writable_dir, write_json
from ..files.progress import progress_bar
from ._tree import prune_intermediate_layers
from .adapters import Adapter, Installed, adapter_for
from .adapters.base import ADAPTER_METADATA
from .backward import BackwardRecorder
from .compat import sanitize_repr
from .compiled import CompileWatch, uncompiled
from .decode_steps import StepTracker
from .distributed import current_rank, run_start, versioned_collectives, world_size
from .encode import Encoder, TensorMode
from .graph import GraphNodes
from .journal import FolderClaim, Journal, claim_folder, held_claim
from .kv_cache import with_cache_layer
from .observer import CallObserver
from .ops import OpRecorder, OpSelection, op_capture, select_ops
from .options import CaptureOptions
from .parallel_layouts import mark, model_mesh, style_layouts
from .pipeline import DEFAULT_POOL_MB, close_pipeline, payload_pipeline
from .signals import termination_as_interrupt
from .tokens import ReferenceTokens, check_forcing_model, forcing_option, read_reference_tokens
from .verify import Verification, compare_outputs

RETURN_NOT_RECORDED_WHY = "its return was not recorded before its caller's: its outputs are missing"


@dataclass
class CaptureSession:
    """What a capture did, filled in as it runs and final when the context exits."""

    trace_dir: Path
    recording: bool
    complete: bool = False
    calls: int = 0
    files: int = 0
    payload_bytes: int = 0
    ops: int = 0
    error: dict[str, Any] | None = None
    verification: Verification | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return short_repr(self, trace_dir=str(self.trace_dir), complete=self.complete, calls=self.calls,
                          files=self.files, payload_bytes=self.payload_bytes, error=_error_line(self.error))

    def _repr_html_(self) -> str:
        facts = [("trace folder", str(self.trace_dir)), ("complete", self.complete), ("calls", self.calls),
                 ("files", self.files), ("payload bytes", self.payload_bytes), ("error", _error_line(self.error))]
        if self.verification is not None:
            facts.append(("verification", "bit-identical" if self.verification.identical else "differs"))
        return summary_html("CaptureSession", facts)


def _error_line(error: dict[str, Any] | None) -> str | None:
    """``"Type: message"`` of a recorded error, or None."""
    return None if error is None else f"{error.get('type', 'error')}: {error.get('message', '')}"


class _NativeRecorder:
    def __init__(self, model: nn.Module, encoder: Encoder, progress: Any) -> None:
        self.model_name = type(model).__name__
        self.encoder = encoder
        self.progress = progress
        self.stack: list[dict[str, Any]] = []
        self.counts: defaultdict[str, int] = defaultdict(int)
        self.tree: dict[str, Any] | None = None
        # The exception that escaped a top-level call; one caught inside the model does not count.
        self.escaped_error: dict[str, Any] | None = None
        self._raised_in_call: dict[str, Any] | None = None
        self.failure: TracediffError | None = None
        self.backward: BackwardRecorder | None = None
        self.root_call: tuple[tuple[Any, ...], dict[str, Any], Any, Any] | None = None
        self._rng_at_root: Any = None
        self.journal: Journal | None = None  # calls started and finished, for a process that dies (journal.py)
        self.steps: StepTracker | None = None  # the decode step of each top-level call made by generate
        # id(module) -> the placements its TP style implies for args[0] and the output (parallel_layouts.py)
        self.styles: dict[int, tuple[str | None, str | None, str]] = {}
        self.compiled: CompileWatch | None = None  # the compiled regions and Dynamo's activity (compiled.py)
        self.observer: CallObserver = self  # what module calls are reported to (op-level capture wraps it)
        # Calls that ran and whose record could not be placed: counted where they were intercepted, apart from
        # the tree, so that a capture that lost one never says it is complete (the metadata's unrecorded_calls).
        self.unrecorded = 0
        self.unrecorded_examples: list[dict[str, Any]] = []
        self.graph = GraphNodes(self)  # what a graph runtime's nodes are written through (graph.py)

    # --- a graph runtime's nodes (graph.py: the GraphNodeSink an adapter is handed) ------------------------------

    def begin_step(self) -> None:
        self.graph.begin_step()

    def end_step(self) -> None:
        self.graph.end_step()

    def record_node(self, *, key: Hashable, name: str, op: str, scope: str | Sequence[str] | None, output: Any,
                    sources: Sequence[Hashable] = (), attributes: Mapping[str, Any] | None = None) -> None:
        self.graph.record_node(key=key, name=name, op=op, scope=scope, output=output, sources=sources,
                               attributes=attributes)

    # --- module calls (the CallObserver of _patch.py) ------------------------------------------------------------

    def enter(self, module: nn.Module, path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call_index = self.counts[path]
        self.counts[path] += 1
        node = fmt.node_entry(path, module_type=type(module).__name__, call_index=call_index)
        if path == self.model_name and self.root_call is None:
            self._rng_at_root = _rng_state()
        if not self.stack and self.steps is not None:
            self.steps.begin(node)
        prefix = fmt.call_prefix(path, call_index)
        # Encode each argument on its own so that ``inputs`` is always {"args": [...], "kwargs": {...}},
        # even when every argument is a plain Python value.
        inputs: dict[str, Any] = {}
        if args:
            name = fmt.payload_name(fmt.payload_name(prefix, fmt.INPUTS), fmt.ARGS)
            inputs[fmt.ARGS] = [self._encode(arg, fmt.payload_name(name, i)) for i, arg in enumerate(args)]
            style = self.styles.get(id(module)) if self.styles else None
            if style is not None:
                mark(inputs[fmt.ARGS][0], style[0], style[2])
        if kwargs:
            name = fmt.payload_name(fmt.payload_name(prefix, fmt.INPUTS), fmt.KWARGS)
            recorded = with_cache_layer(module, kwargs)  # the cache as the tensors this call reads
            inputs[fmt.KWARGS] = {str(k): self._encode(v, fmt.payload_name(name, k)) for k, v in recorded.items()}
        node[fmt.INPUTS] = inputs
        node[fmt.CHILDREN] = []
        if self.journal is not None:
            self.journal.entered(node, self.stack[-1] if self.stack else None)
        self.stack.append(node)
        return (node, prefix, args, kwargs, module)

    def exit(self, token: Any, output: Any) -> None:
        node, prefix, args, kwargs, module = token
        if not self._open(node):
            return  # closed already, when a call it was inside returned first: counted as unrecorded then
        node[fmt.OUTPUTS] = self._encode(output, fmt.payload_name(prefix, fmt.OUTPUTS))
        style = self.styles.get(id(module)) if self.styles else None
        if style is not None:
            mark(node[fmt.OUTPUTS], style[1], style[2])
        if node[fmt.MODULE_PATH] == self.model_name and self.root_call is None:
            self.root_call = (args, kwargs, output, self._rng_at_root)
        self._raised_in_call = None  # a call returned: any exception raised before was caught by the model
        self._close(node)

    def error(self, token: Any, exc: BaseException) -> None:
        node = token[0]
        if not self._open(node):
            return
        message = sanitize_repr(str(exc)).splitlines()[0] if str(exc) else ""
        node[fmt.ERROR] = fmt.error_entry(type(exc).__name__, message)
        if self._raised_in_call is None:  # the innermost module, where the exception was raised
            self._raised_in_call = {fmt.MODULE_PATH: node[fmt.MODULE_PATH], fmt.CALL_INDEX: node[fmt.CALL_INDEX],
                                    **node[fmt.ERROR]}
        if self._close(node, error=node[fmt.ERROR]):
            if self.escaped_error is None:
                self.escaped_error = self._raised_in_call
            self._raised_in_call = None

    def _encode(self, value: Any, name: str) -> Any:
        if self.failure is not None:
            return None
        try:
            return self.encoder.encode(value, name)
        except TracediffError as e:  # e.g. the disk filled up: stop recording, keep the forward going
            self.failure = e
            return None
        except Exception as e:  # noqa: BLE001 - capture must never break the user's forward
            self.failure = TracediffError(f"{name}: could not record value: {type(e).__name__}: {e}")
            return None

    def stopped(self, error: TracediffError) -> None:
        """Recording failed outside a hook (a held payload could not be written): keep the first reason."""
        if self.failure is None:
            self.failure = error

    def op_recorded(self, node: dict[str, Any], call: dict[str, Any]) -> None:
        """An op node was added as the last child of ``call`` (op-level capture): journal it."""
        if self.journal is not None:  # written once the op's payloads are on disk
            self.journal.op(node, call, len(call[fmt.CHILDREN]) - 1, self.encoder.when_complete)

    def backward_recorded(self, node: dict[str, Any]) -> None:
        """A backward node got gradients (backward capture): journal it as it is now."""
        if self.journal is not None:
            self.journal.backward(node, self.encoder.when_complete)

    def call_lost(self, path: str, call_index: int | None, why: str) -> None:
        """A call ran and its record cannot be placed in the tree (compiled code's records: record_op.py)."""
        self.unrecorded += 1
        if len(self.unrecorded_examples) < fmt.UNRECORDED_EXAMPLES:
            self.unrecorded_examples.append(fmt.unrecorded_call_entry(path, call_index, why))

    def _open(self, node: dict[str, Any]) -> bool:
        """True while ``node``'s call is on the stack (at its top, unless records came out of order)."""
        return bool(self.stack) and (self.stack[-1] is node or any(open_node is node for open_node in self.stack))

    def _close(self, node: dict[str, Any], *, error: dict[str, Any] | None = None) -> bool:
        """Attach a finished call to its parent; True when it was a top-level call.

        Calls still open inside it are closed first. With ``error`` (the exception that ended ``node``) they
        raised it too; without, ``node`` returned before them: their return was not recorded in order (records
        of compiled code out of program order), so each is kept without outputs and counted unrecorded.
        """
        while self.stack and self.stack[-1] is not node and self._open(node):
            inner = self.stack[-1]
            if error is not None:
                inner[fmt.ERROR] = error
            else:
                inner[fmt.ERROR] = fmt.error_entry(fmt.RETURN_NOT_RECORDED, RETURN_NOT_RECORDED_WHY)
                self.call_lost(inner[fmt.MODULE_PATH], inner[fmt.CALL_INDEX], RETURN_NOT_RECORDED_WHY)
            self._close(inner, error=error)
        if self.journal is not None:  # written once the call's payloads are on disk
            self.journal.finished(node, self.encoder.when_complete)
        if self.stack and self.stack[-1] is node:
            self.stack.pop()
        if not node[fmt.CHILDREN]:
            del node[fmt.CHILDREN]
        self.progress.update(1)
        if self.stack:
            self.stack[-1][fmt.CHILDREN].append(node)
            return False
        if self.tree is None:
            self.tree = node
        else:
            self.tree.setdefault(fmt.SUBSEQUENT_CALLS, []).append(node)
        return True


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


# The folder is taken, checked and cleared by ``journal.claim_folder``: lock first, then only the earlier trace's
# listed files are removed (removing every ``*.safetensors`` took the user's own inputs file with it).


@contextmanager
def capture(
    model: nn.Module,
    out_dir: str | Path,
    *,
    tensors: TensorMode = "full",
    prune_layers: bool = False,
    overwrite: bool = False,
    verify: bool = False,
    ranks: Literal["all"] | int = 0,
    full_dtensor: bool = False,
    backward: bool = False,
    progress: bool = False,
    ops: bool | Sequence[str] = False,
    ops_exclude: str | Sequence[str] = (),
    ops_in: str | Sequence[str] = (),
    ops_min_numel: int = 0,
    writers: int | None = None,
    pool_mb: int = DEFAULT_POOL_MB,
    steps: str | Sequence[int] | None = None,
    teacher_forcing: str | Path | None = None,
    other_steps: str = "stats",
    compiled: str = "modules",
) -> Iterator[CaptureSession]:
    """Record every module call of ``model`` made inside the block into ``out_dir``.

    Args:
        model: the module to trace. Every submodule's ``forward`` is wrapped
            for the duration of the block and restored exactly afterwards.
            An ``mlx.nn.Module`` or ``flax.nnx.Module`` is traced through its
            classes' ``__call__``, restored as exactly; its arrays are
            evaluated where recorded.
        out_dir: the trace folder. It must be empty or absent, unless
            ``overwrite=True``, which first removes the files of an earlier trace.
        tensors: ``"full"`` (default) writes one safetensors payload per
            distinct tensor; ``"summary"`` writes statistics only; ``"repr"``
            stores ``repr()`` lines in the JSON, as ``use_repr=True`` does.
        prune_layers: keep only the first and last numbered layer blocks in
            the JSON, as transformers' debugger does by default (default False).
        verify: on exit, rerun the first top-level call without capture (from
            the RNG state it started with) and compare outputs bit for bit.
        ranks: under ``torch.distributed``, the rank that records (default 0),
            or ``"all"``: every rank writes its own trace to ``out_dir/rank{r}``.
        full_dtensor: record a DTensor's full (gathered) value instead of its
            local shard. Every rank then takes part in the gathers.
        backward: also record, for every module call, the gradients flowing
            into and out of it when ``backward()`` runs inside the block (see
            :mod:`tracediff.capturing.backward`).
        progress: show a progress bar of module calls on stderr (only when
            stderr is a terminal).
        ops: also record the torch functions each module's own code calls,
            as op nodes under the module call (default False). ``True``: every
            op but views and shape queries; a list of glob patterns
            (``["matmul", "softmax"]``): only those. See
            :mod:`tracediff.capturing.ops`.
        ops_exclude: op name patterns not to record (implies ``ops=True``).
        ops_in: record ops only inside module calls whose path matches one of
            these globs, and inside their submodules (implies ``ops=True``).
        ops_min_numel: skip ops whose tensor outputs all have fewer elements
            (default 0).
        writers: threads that write payload files while the forward goes on
            (``tensors="full"`` only). Default: 2 with CUDA or when cores
            outnumber torch's threads, else 0 (written in the hook). See
            :mod:`tracediff.capturing.pipeline`.
        pool_mb: host memory for payloads waiting for a writer, in MiB
            (default 256). The forward waits when it is full; a tensor larger
            than the pool is written directly.
        steps: the decode steps of ``model.generate(...)`` whose tensors are
            written in full (``[0, 1, -1]`` or ``"0,1,-1"``; negative: from
            the last step); the others keep statistics only. Default None:
            every step in full. Every top-level call made by ``generate`` is
            numbered (``step``) either way. See
            :mod:`tracediff.capturing.decode_steps`.
        other_steps: what the steps ``steps`` leaves out keep: ``"stats"``
            (default: every tensor's statistics) or ``"tree"`` (the call tree,
            each tensor's shape, dtype and device, and the tokens; no statistics
            are computed, so such a capture costs least).
        teacher_forcing: a reference trace captured around ``generate``: each
            ``model.generate(...)`` in the block is fed the reference's token
            at every step instead of its own choice, and stops after the
            reference's number of tokens; the model's own greedy choice is
            recorded beside it (``tokens`` of each step). Needs transformers'
            ``generate`` without beam search, the reference's vocabulary size
            and prompt. Default None: the model chooses. See
            :mod:`tracediff.capturing.tokens`.
        compiled: how the values of code compiled with ``torch.compile`` are
            taken. ``"modules"`` (default): every module, recorded from
            inside the compiled graph by an opaque op, so the graph keeps its
            fusions (each compiled region is compiled once more, with the
            records in it). ``"regions"``: only the calls of the compiled
            regions (``layer.compile()``, ``torch.compile(layer)``), from
            outside, running the code compiled before the capture unchanged.
            See :mod:`tracediff.capturing.compiled` and docs/compiled.md.

    Yields:
        A ``CaptureSession``, complete once the block exits.

    Raises:
        UsageError: an option the model's runtime does not support (MLX and
            Flax NNX models: ``ops``, ``backward``, ``verify``, ``steps``,
            ``teacher_forcing``, ``full_dtensor``; the message names the
            runtime), or a model no adapter recognises.
        OutputDirError: ``out_dir`` is a file, not writable, or holds a trace;
            or writing a payload failed mid-capture (the trace written so far
            is kept and marked incomplete).
        TeacherForcingError: ``teacher_forcing`` holds no generated tokens,
            or another vocabulary (before anything is written), or another
            prompt (when ``generate`` is called).
    """
    options = CaptureOptions(
        tensors=tensors, prune_layers=prune_layers, overwrite=overwrite, verify=verify, ranks=ranks,
        full_dtensor=full_dtensor, backward=backward, progress=progress, ops=ops, ops_exclude=ops_exclude,
        ops_in=ops_in, ops_min_numel=ops_min_numel, writers=writers, pool_mb=pool_mb, steps=steps,
        teacher_forcing=teacher_forcing, other_steps=other_steps, compiled=compiled)
    with _capture(model, out_dir, options) as session:
        yield session


@contextmanager
def _capture(model: Any, out_dir: str | Path, options: CaptureOptions,
             adapter: Adapter | None = None) -> Iterator[CaptureSession]:
    """``capture`` with its options gathered, under ``adapter`` (the model's runtime) when the caller chose it.

    The stages: decide everything that needs no folder (``_plan``), claim the folder, build the recorder,
    install the adapter's interception, yield, restore, finish the trace.
    """
    if adapter is None:
        adapter = adapter_for(uncompiled(model))  # the one place a model's runtime is decided, unless handed down
    plan = _plan(model, Path(out_dir), options.checked(adapter), adapter)
    if not plan.recording:
        yield from _pass_through(plan.model, adapter, CaptureSession(trace_dir=plan.folder, recording=False),
                                 gather=options.full_dtensor and plan.world > 1, verify=options.verify)
        return
    claim = _claim(plan.folder, overwrite=options.overwrite)
    run = _start(plan)
    patch = adapter.install(plan.model, run.recorder, run.entry)
    raised = False
    try:
        with _recording(run):
            yield run.session
    except BaseException:
        raised = True
        raise
    finally:
        _restore(run, patch)
        _verify_run(run, raised)
        try:
            _finish(run)
        finally:
            _close_journal(run)
            claim.release()
    if run.recorder.failure is not None:
        raise run.recorder.failure


@dataclass(frozen=True)
class _Plan:
    """What a capture decided before touching its folder: the model to patch, its runtime, where it writes."""

    options: CaptureOptions
    adapter: Adapter
    caller: Any  # the model as given (compiled, when it was given compiled): what ``verify`` reruns
    model: Any  # the model patched: an ``OptimizedModule``'s own module
    watch: CompileWatch
    forcing: ReferenceTokens | None
    selection: OpSelection | None
    rank: int
    world: int
    out: Path
    folder: Path

    @property
    def recording(self) -> bool:
        return self.options.records(self.rank)

    @property
    def sharded(self) -> bool:
        return self.options.sharded(self.world)


def _plan(model: Any, out: Path, options: CaptureOptions, adapter: Adapter) -> _Plan:
    """The checks that need the model (a compiled region, the reference's vocabulary, ``ops_in``), and the
    folder this rank writes."""
    watch = CompileWatch(model, options.compiled)  # torch.compile(model): the model it wraps, its own paths
    patched = watch.model
    forcing = read_reference_tokens(options.teacher_forcing) if options.teacher_forcing is not None else None
    if forcing is not None:
        check_forcing_model(forcing, patched)
    selection = select_ops(patched, options.ops, exclude=options.ops_exclude, inside=options.ops_in,
                           min_numel=options.ops_min_numel)
    rank, world = current_rank(), world_size()
    folder = out / f"rank{rank}" if options.sharded(world) else out
    return _Plan(options, adapter, model, patched, watch, forcing, selection, rank, world, out, folder)


def _claim(folder: Path, *, overwrite: bool) -> FolderClaim:
    """The folder, locked first, then checked and cleared: a second capture into it is refused, never
    overwritten (the claim ``capture_spec`` took before building the model is taken over)."""
    claim = held_claim(folder) or claim_folder(folder, overwrite=overwrite)
    claim.in_use = True
    try:
        claim.clear_earlier_trace()
        ensure_writable_dir(folder)
    except BaseException:
        claim.release()
        raise
    return claim


@dataclass
class _Run:
    """A recording capture while it runs: what its stages hand each other."""

    plan: _Plan
    session: CaptureSession
    recorder: _NativeRecorder
    op_recorder: OpRecorder | None
    entry: dict[str, Any]  # the metadata's options object, completed as the capture ends
    bar: Any
    started: _dt.datetime
    identity: _RunIdentity
    quiet: Any = None  # backward's warnings filter while the block runs


def _start(plan: _Plan) -> _Run:
    """The recorder and everything it writes through (encoder, journal, decode steps, ops, backward)."""
    options, model, folder = plan.options, plan.model, plan.folder
    pipeline = payload_pipeline(options.tensors, options.writers, options.pool_mb)
    encoder = Encoder(folder, options.tensors, full_dtensor=options.full_dtensor, pipeline=pipeline,
                      measure=plan.adapter.measure())
    bar = progress_bar(options.progress, desc="capture", unit=" calls")
    recorder = _NativeRecorder(model, encoder, bar)
    recorder.compiled = plan.watch
    started = _dt.datetime.now(_dt.timezone.utc)
    # microseconds: two runs launched side by side (two torchrun jobs in one second) must not share an identity
    identity = _RunIdentity(started.isoformat(timespec="microseconds"), None)
    if plan.sharded:
        identity = _sharded_run(model, plan.out, identity.started, plan.rank, plan.world, type(model).__name__)
        recorder.styles = style_layouts(model, identity.mesh)
    recorder.journal = Journal(folder)
    recorder.steps = StepTracker(model, encoder, options.step_numbers, fail=recorder.stopped, forcing=plan.forcing,
                                 others=options.other_steps)
    op_recorder = op_capture(recorder, plan.selection)
    recorder.observer = op_recorder or recorder
    recorder.backward = BackwardRecorder(model, recorder.model_name, recorder._encode, recorder.counts,
                                         on_recorded=recorder.backward_recorded) if options.backward else None
    entry = options.metadata(ops=op_recorder.selection.to_dict() if op_recorder else None,
                             payload_pipeline=pipeline.options if pipeline is not None else None,
                             teacher_forcing=forcing_option(plan.forcing))
    session = CaptureSession(trace_dir=folder, recording=True)
    return _Run(plan, session, recorder, op_recorder, entry, bar, started, identity)


@contextmanager
def _recording(run: _Run) -> Iterator[None]:
    """While the block runs: backward's warnings quiet, decode steps and ops recorded, SIGTERM/SIGHUP ending the
    forward as Ctrl-C does (the partial trace is kept), the collectives of a multi-rank run versioned."""
    if run.plan.options.backward:
        # Full backward hooks warn about every non-tuple output (ModelOutput); the records say it better.
        run.quiet = warnings.catch_warnings()
        run.quiet.__enter__()
        warnings.filterwarnings("ignore", message="For backward hooks to be called")
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
    assert run.recorder.steps is not None
    run.recorder.steps.install()
    if run.op_recorder is not None:
        run.op_recorder.start()
    with termination_as_interrupt(), versioned_collectives() if run.plan.sharded else nullcontext():
        yield


def _restore(run: _Run, patch: Installed) -> None:
    """Undo every interception, in the reverse order of its installation, after an exception too."""
    recorder = run.recorder
    if run.op_recorder is not None:
        run.op_recorder.stop()
        run.session.ops = run.op_recorder.recorded
    patch.restore()
    recorder.graph.finish()
    assert recorder.steps is not None
    recorder.steps.restore()
    run.entry[fmt.STEPS_OPTION] = recorder.steps.options
    if run.quiet is not None:
        run.quiet.__exit__(None, None, None)
    if recorder.backward is not None:
        recorder.backward.remove()
    run.bar.close()


def _verify_run(run: _Run, raised: bool) -> None:
    """``verify``: rerun the first top-level call as the caller gave the model (compiled, when it was)."""
    recorder = run.recorder
    if run.plan.options.verify and not raised and recorder.root_call is not None and recorder.failure is None:
        run.session.verification = _verify(run.plan.caller, recorder.root_call)


def _close_journal(run: _Run) -> None:
    """The journal is removed once the trace JSON is written; kept (closed) when it is not, for recovery."""
    recorder = run.recorder
    written = recorder.tree is None or (run.plan.folder / fmt.trace_file_names(recorder.model_name)[0]).is_file()
    assert recorder.journal is not None
    recorder.journal.close() if not written else recorder.journal.remove()


@dataclass(frozen=True)
class _RunIdentity:
    """What every rank of one run records alike: rank 0's start time and the device mesh (None: one process)."""

    started: str
    mesh: dict[str, Any] | None


def _sharded_run(model: nn.Module, out: Path, started: str, rank: int, world: int, model_name: str) -> _RunIdentity:
    """The identity of a multi-rank capture; rank 0 writes the folder's manifest (``tracediff_ranks.json``).

    Every rank takes part in one broadcast (rank 0's start time). A model without DTensors gets a 1-D mesh
    named ``world`` over all ranks.
    """
    shared = run_start(started)
    mesh = model_mesh(model) or fmt.mesh_entry([world], ["world"], [rank])
    if rank == 0:
        manifest_mesh = {k: v for k, v in mesh.items() if k != fmt.MESH_COORDINATES}
        write_json(out / fmt.RANKS_FILE, fmt.ranks_entry({
            "tracediff_version": __version__, "world_size": world,
            "ranks": [fmt.rank_folder(r) for r in range(world)], "mesh": manifest_mesh,
            "run_started": shared, "model_name": model_name,
        }))
    return _RunIdentity(shared, mesh)


def _pass_through(
    model: nn.Module, adapter: Adapter, session: CaptureSession, *, gather: bool, verify: bool
) -> Iterator[CaptureSession]:
    """On a rank that does not record, take part in the collectives of the recording ranks.

    Those gather DTensors (``full_dtensor``) and rerun the forward (``verify``).
    Running the same recorder, writing nothing, makes the gathers match the
    recording rank's one for one (same traversal, same deduplication).
    """
    if not gather and not verify:
        yield session
        return
    recorder = _NativeRecorder(model, Encoder(session.trace_dir, "summary", full_dtensor=gather),
                               progress_bar(False, desc="capture", unit=" calls"))
    patch = adapter.install(model, recorder, {})
    raised = False
    try:
        yield session
    except BaseException:
        raised = True
        raise
    finally:
        patch.restore()
        if verify and not raised and recorder.root_call is not None and recorder.failure is None:
            session.verification = _verify(model, recorder.root_call)


def _verify(model: nn.Module, root_call: tuple[tuple[Any, ...], dict[str, Any], Any, Any]) -> Verification:
    args, kwargs, captured, rng = root_call
    after = _rng_state()
    _set_rng_state(rng)
    try:
        plain = model(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - a behaviour difference to report, not a reason to lose the trace
        message = str(e).splitlines()[0] if str(e) else ""
        return Verification(identical=False, compared=0,
                            differences=(f"the run without capture raised {type(e).__name__}: {message}",))
    finally:
        _set_rng_state(after)
    return compare_outputs(captured, plain)


def _imported_version(package: str) -> str | None:
    """The version of ``package`` if the process has imported it (we never import it ourselves)."""
    module = sys.modules.get(package)
    return getattr(module, "__version__", None) if module is not None else None


def _adapter_metadata(adapter: Adapter, model: Any) -> dict[str, Any]:
    """What the adapter adds to the metadata (``forward_parameters``, ...); a key it may not set is an error."""
    extra = adapter.metadata(model)
    unknown = sorted(set(extra) - ADAPTER_METADATA)
    if unknown:
        raise TracediffError(f"adapter {adapter.framework}: metadata keys {', '.join(unknown)} are not its to set")
    if adapter.graph is not None:  # what the runtime's ops and scopes mean, for every reader (trace/vocabulary.py)
        extra[fmt.GRAPH_KEY] = adapter.graph.to_json()
    return extra


def _compile_metadata(recorder: _NativeRecorder) -> dict[str, Any]:
    """The metadata's ``compile`` object, when the model ran compiled (compiled.py)."""
    found = recorder.compiled.metadata(recorder.model_name) if recorder.compiled is not None else None
    return {fmt.COMPILE: found} if found is not None else {}


def _finish(run: _Run) -> None:
    """Close the open calls, wait for the payloads, then write the tree and the metadata (after a failure too)."""
    session, recorder = run.session, run.recorder
    encoder = recorder.encoder
    close_pipeline(recorder, run.entry)
    open_calls = bool(recorder.stack)
    while recorder.stack:  # calls interrupted by something other than an exception in forward
        recorder._close(recorder.stack[-1])
    session.calls = sum(recorder.counts.values())
    session.files, session.payload_bytes = encoder.files, encoder.payload_bytes
    session.error = recorder.escaped_error
    session.complete = (
        recorder.tree is not None and recorder.escaped_error is None and recorder.failure is None and not open_calls
        and not recorder.unrecorded
    )
    metadata = session.metadata = _metadata(run)
    try:
        if recorder.tree is not None:
            tree = recorder.tree
            if recorder.backward is not None and recorder.backward.nodes:
                tree[fmt.BACKWARD] = recorder.backward.nodes
            if run.plan.options.prune_layers:
                prune_intermediate_layers(tree)
            encoder.stage.write_tree(tree, recorder.model_name)  # FULL_TENSORS, and SUMMARY without values
    except TracediffError as e:
        if recorder.failure is None:
            recorder.failure = e
        session.complete = metadata["complete"] = False
        metadata["capture_failure"] = str(recorder.failure)
    try:  # still worth a try after a failure: it says the trace is incomplete, and why
        encoder.stage.write_metadata(metadata)
    except TracediffError as e:
        if recorder.failure is None:
            recorder.failure = e


def _metadata(run: _Run) -> dict[str, Any]:
    """The trace's ``tracediff_metadata.json`` object, once the capture has ended."""
    session, recorder, plan, identity = run.session, run.recorder, run.plan, run.identity
    model, adapter, encoder = plan.model, plan.adapter, recorder.encoder
    return encoder.stage.metadata({  # the stage adds the version, devices, dtypes and framework
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "transformers_version": _imported_version("transformers"),
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "model_name": recorder.model_name,
        "world_size": plan.world,
        "rank": plan.rank,
        "created": run.started.isoformat(timespec="seconds"),
        "options": run.entry,
        "complete": session.complete,
        "error": recorder.escaped_error,
        "capture_failure": str(recorder.failure) if recorder.failure else None,
        "calls": session.calls,
        fmt.UNRECORDED_CALLS: fmt.unrecorded_calls_entry(recorder.unrecorded, recorder.unrecorded_examples),
        "payload_files": encoder.files,
        "payload_bytes": encoder.payload_bytes,
        "verification": session.verification.to_dict() if session.verification is not None else None,
        **_compile_metadata(recorder),
        **_adapter_metadata(adapter, model),
        # multi-rank only
        **({"mesh": identity.mesh, "run_started": identity.started} if identity.mesh is not None else {}),
    }, framework=adapter.framework, framework_version=adapter.version())
