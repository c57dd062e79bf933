"""Graph nodes: what a runtime whose work is a graph records, instead of module calls.

llama.cpp evaluates a ggml graph, ONNX Runtime a graph of ONNX nodes: neither calls Python modules. Their
adapter (:mod:`tracediff.capturing.adapters`) is handed the capture's recorder, a ``GraphNodeSink``, and
feeds it every node it observes, with the node's dataflow::

    sink.begin_step()                       # one evaluation (a decode call) of the graph
    sink.record_node(key=(0, 3), name="attn_norm", op="RMS_NORM", scope="blk.0",
                     output=array, sources=[(0, 2)], attributes={"eps": 1e-6})
    sink.end_step()

* ``key`` is the adapter's own identity of this output (ggml reuses tensor memory and an ONNX value has no
  stable Python object, so object identity cannot say which output is which): ``(step, node index)``, a value
  name. ``sources`` are the keys of what the node read. A key recorded earlier, in this step or an earlier
  one, is that node; a key recorded twice means its latest record; an unknown key is an input from outside the
  trace (a weight, the prompt), recorded as such, never an error.
* ``scope`` is a name (llama.cpp's ``blk.0``) or, for a runtime whose scopes are the module paths a node was
  exported from (ONNX name scopes, ExecuTorch's ``nn_module_stack``), their chain outermost first
  (``["model", "model.layers.0", "model.layers.0.mlp"]``), kept as the node's ``scopes``; None: no scope.
* The node is written as a call under the step's top-level call: ``module_path`` ``{Model}.{scope}.{name}``
  (the innermost scope of a chain; ``{Model}.{name}`` without a scope), so that ``blk.0.attn_norm`` and
  ``blk.1.attn_norm`` are the same layer's calls in two blocks, as module calls are; ``call_index`` counts
  the calls of one path across the trace; ``module_type`` is ``op``. Its ``inputs`` hold the tensor entries
  of its sources (the same entries, so the same payloads, as their producers' ``outputs``) and its
  ``sources`` the producers' identities.
* Each step is a top-level call of the model with ``step`` 0, 1, ...; its ``outputs`` are the outputs of
  the step's nodes that no later node of the step read (the graph's results).
* ``output`` is a ``torch.Tensor`` or a ``numpy.ndarray`` in torch's dimension order, of its own dtype
  (float32, float16, bfloat16 as ``torch.bfloat16`` or ml_dtypes', integers). Payloads, statistics, the
  journal and the SIGKILL guarantees are those of module calls: the same encoder and journal write them.

No method raises into the runtime: a node that cannot be recorded stops the recording, the capture ends
with its trace marked incomplete and names why (as a module call's failure does). The format is specified in
docs/trace-format.md, section "Graph nodes".
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .. import format as fmt
from ..errors import TracediffError

if TYPE_CHECKING:
    import numpy as np
    import torch

    from .journal import Journal

__all__ = ["GraphNodeSink", "GraphNodes"]


class GraphNodeSink(Protocol):
    """What a graph runtime's adapter is handed by the capture: one node at a time, in evaluation order."""

    def record_node(self, *, key: Hashable, name: str, op: str, scope: str | Sequence[str] | None,
                    output: torch.Tensor | np.ndarray, sources: Sequence[Hashable] = (),
                    attributes: Mapping[str, Any] | None = None) -> None: ...

    def begin_step(self) -> None: ...  # one evaluation / decode call of the graph = one step

    def end_step(self) -> None: ...


class CallTree(Protocol):
    """The parts of the capture's recorder that graph nodes are written through (``session._NativeRecorder``)."""

    model_name: str
    counts: Any  # path -> calls so far (a defaultdict(int))
    stack: list[dict[str, Any]]
    journal: Journal | None
    failure: TracediffError | None

    def _encode(self, value: Any, name: str) -> Any: ...

    def _close(self, node: dict[str, Any]) -> bool: ...

    def stopped(self, error: TracediffError) -> None: ...


class GraphNodes:
    """A ``GraphNodeSink`` writing into a capture's call tree (one per capture)."""

    def __init__(self, tree: CallTree) -> None:
        self._tree = tree
        self._steps = 0
        self._step: dict[str, Any] | None = None  # the open step's top-level call
        self._produced: dict[Hashable, tuple[str, int, Any]] = {}  # key -> (path, call_index, output entry)
        self._unread: dict[int, Any] = {}  # this step's outputs no later node of the step read, by node id
        self._unread_order: list[int] = []
        self._implicit = False  # the open step was begun by a node, not by begin_step

    @property
    def open(self) -> bool:
        """True while a step is open."""
        return self._step is not None

    def begin_step(self) -> None:
        """Open the next step (a top-level call of the model); an open step is ended first."""
        try:
            if self._step is not None:
                self.end_step()
            tree = self._tree
            name = tree.model_name
            call_index = tree.counts[name]
            tree.counts[name] += 1
            node = fmt.node_entry(name, module_type=name, call_index=call_index, inputs={})
            node[fmt.STEP] = self._steps
            node[fmt.CHILDREN] = []
            self._steps += 1
            if tree.journal is not None:
                tree.journal.entered(node, None)
            tree.stack.append(node)
            self._step, self._implicit = node, False
            self._unread, self._unread_order = {}, []
        except Exception as e:  # noqa: BLE001 - never raise into the runtime
            self._tree.stopped(TracediffError(f"step {self._steps}: could not record it: {type(e).__name__}: {e}"))

    def end_step(self) -> None:
        """Close the open step; its ``outputs`` are the outputs no later node of the step read."""
        step = self._step
        if step is None:
            return
        self._step = None
        try:
            results = [self._unread[i] for i in self._unread_order if i in self._unread]
            if results:
                step[fmt.OUTPUTS] = results[0] if len(results) == 1 else results
            self._tree._close(step)
        except Exception as e:  # noqa: BLE001 - never raise into the runtime
            self._tree.stopped(TracediffError(f"step {step.get(fmt.STEP)}: could not close it: "
                                              f"{type(e).__name__}: {e}"))

    def finish(self) -> None:
        """At the end of a capture: close a step that nodes opened without ``begin_step``.

        A step opened by ``begin_step`` and never ended was interrupted: it stays open, and the trace is
        marked incomplete.
        """
        if self._step is not None and self._implicit:
            self.end_step()

    def record_node(self, *, key: Hashable, name: str, op: str, scope: str | Sequence[str] | None,
                    output: torch.Tensor | np.ndarray, sources: Sequence[Hashable] = (),
                    attributes: Mapping[str, Any] | None = None) -> None:
        """Record one node's output and what it read (see the module docstring); never raises."""
        tree = self._tree
        if tree.failure is not None:
            return
        try:
            if self._step is None:
                self.begin_step()
                self._implicit = True
            step = self._step
            if step is None:  # begin_step failed and said why
                return
            chain = [scope] if isinstance(scope, str) else [str(s) for s in scope or () if s]
            inner = chain[-1] if chain else None
            path = f"{tree.model_name}.{inner}.{name}" if inner else f"{tree.model_name}.{name}"
            call_index = tree.counts[path]
            tree.counts[path] += 1
            prefix = fmt.call_prefix(path, call_index)
            read = [self._produced.get(source) for source in sources]
            args = [fmt.typed_repr(fmt.EXTERNAL_INPUT, _key_text(source)) if known is None else known[2]
                    for source, known in zip(sources, read)]
            node = fmt.node_entry(path, module_type=op, call_index=call_index,
                                  inputs={fmt.ARGS: args} if args else {}, children=[])
            node[fmt.SOURCES] = [fmt.source_entry(None, None, _key_text(source)) if known is None
                                 else fmt.source_entry(known[0], known[1])
                                 for source, known in zip(sources, read)]
            if attributes:
                node[fmt.ATTRIBUTES] = _json_attributes(attributes)
            if not isinstance(scope, str) and chain:
                node[fmt.NODE_SCOPES] = chain
            for known in read:
                if known is not None:
                    self._unread.pop(id(known[2]), None)
            if tree.journal is not None:
                tree.journal.entered(node, step)
            tree.stack.append(node)
            node[fmt.OUTPUTS] = entry = tree._encode(host_tensor(output), fmt.payload_name(prefix, fmt.OUTPUTS))
            tree._close(node)
            self._produced[key] = (path, call_index, entry)
            if entry is not None:
                self._unread[id(entry)] = entry
                self._unread_order.append(id(entry))
        except Exception as e:  # noqa: BLE001 - never raise into the runtime
            tree.stopped(TracediffError(f"graph node {name!r}: could not record it: {type(e).__name__}: {e}"))


def host_tensor(value: Any) -> Any:
    """A numpy array as a CPU tensor of the same dtype (ml_dtypes' bfloat16 by its bits); anything else as it is."""
    import numpy as np

    if not isinstance(value, np.ndarray):
        return value
    from ..files.host import host_tensor as as_tensor

    return as_tensor(value, copy=value.dtype.name == "bfloat16")


def _key_text(key: Hashable) -> str:
    """An unknown source key as the text an ``external`` source keeps (bounded, printable)."""
    from .compat import sanitize_repr

    return sanitize_repr(key if isinstance(key, str) else repr(key))[:200]


def _json_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The node's attributes as JSON: a value JSON cannot hold is kept as its ``repr``."""
    from .compat import sanitize_repr

    return {str(k): fmt.as_json(v) if fmt.is_json_safe(v) else sanitize_repr(repr(v))[:200]
            for k, v in attributes.items()}
