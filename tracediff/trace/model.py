"""The in-memory form of a trace: nodes, tensor records and non-tensor values.

Node identity is explicit. In a trace of ``LlamaModel``:

============================  =============================================
``node.module_path``          ``LlamaModel.layers.0.mlp`` (as recorded)
``node.relative_path``        ``layers.0.mlp`` (root component removed;
                              ``""`` for the root)
``node.call_index``           0 for the module's first call, 1 for the next
``record.slot``               ``inputs.args.0``, ``inputs.kwargs.hidden_states``,
                              ``outputs``, ``outputs.0``,
                              ``outputs.last_hidden_state``, ``outputs.1.0``
``record.order``              position in execution order: a node's inputs
                              are placed when its call starts, its outputs
                              when it returns; backward records
                              (``grad_outputs.0`` on arrival, ``grad_inputs.0``
                              on departure) come after every forward record
============================  =============================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ReprValue(str):
    """A non-tensor value known only by its (sanitized) repr, as the standard trace stores it."""

    __slots__ = ()


@dataclass(frozen=True)
class StepTokens:
    """The tokens of one decode step (``tokens`` of its top-level call, ``docs/trace-format.md`` 2.2).

    ``chosen``: per sequence, the token ``generate`` appended after the step
    (under teacher forcing, the reference's: ``forced``); ``argmax``: the
    token with the highest score (what greedy decoding picks). ``prompt`` and
    ``vocab_size`` are known on step 0 only.
    """

    chosen: tuple[int, ...]
    argmax: tuple[int, ...]
    forced: bool = False
    prompt: tuple[tuple[int, ...], ...] | None = None
    vocab_size: int | None = None


@dataclass(frozen=True, slots=True)  # no per-record __dict__: a large trace holds hundreds of thousands
class TensorRecord:
    """One recorded tensor of a node: where it sits, what it looked like, where its payload is."""

    slot: str
    order: int
    shape: tuple[int, ...] | None
    dtype: str | None
    stats: dict[str, float]
    payload: str | None = None
    repr_lines: tuple[str, ...] | None = None
    stale_reason: str | None = None

    @property
    def has_payload(self) -> bool:
        """True when a payload file is referenced and it holds this call's data."""
        return self.payload is not None and self.stale_reason is None


@dataclass(eq=False, slots=True)
class Node:
    """One module call in a trace."""

    module_path: str
    relative_path: str
    call_index: int
    module_type: str | None
    depth: int
    enter_order: int
    exit_order: int = -1
    tensors: list[TensorRecord] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    children: list[Node] = field(default_factory=list)
    parent: Node | None = field(default=None, repr=False)
    error: dict[str, Any] | None = None
    has_outputs: bool = False
    phase: str = "forward"
    # Op nodes (op-level capture): ``op`` is the qualified torch function name and ``op_index`` its
    # position among the recorded ops of the enclosing call, whose path and call index the op node shares.
    # A module node keeps its op nodes in ``ops`` (in call order), not in ``children``.
    op: str | None = None
    op_index: int | None = None
    ops: list[Node] = field(default_factory=list)
    # a graph node's runtime attributes as recorded (``attributes``: a ggml op's scale, softcap, type)
    attributes: dict[str, Any] = field(default_factory=dict)
    graph: bool = False  # a graph runtime's node (it names its ``sources``), not a module call
    # a graph node's module scopes as recorded (``scopes``, outermost first), when its runtime's scopes are modules
    scopes: tuple[str, ...] | None = None

    @property
    def key(self) -> tuple[str, str, int]:
        """What two traces match on by default: phase, relative path and call index."""
        return (self.phase, self.relative_path, self.call_index)

    def inputs(self) -> list[TensorRecord]:
        return [t for t in self.tensors if t.slot.startswith("inputs")]

    def outputs(self) -> list[TensorRecord]:
        return [t for t in self.tensors if t.slot.startswith("outputs")]

    def walk(self) -> list[Node]:
        """This node and its descendants in call-start order."""
        out: list[Node] = []
        stack = [self]
        while stack:  # iterative: no Python frame per call, and no recursion limit on deep trees
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(node.children))
        return out
