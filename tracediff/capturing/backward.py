"""Recording the backward pass of a capture (``tracediff.capture(..., backward=True)``).

Every module gets a full backward pre-hook and a full backward hook for the
duration of the capture. When gradients reach a module, the gradients of its
outputs (``grad_outputs.i``: what flows into the module during backward) are
recorded; when the module has produced the gradients of its inputs
(``grad_inputs.i``: what flows out), those are recorded too. Backward nodes
are stored in the order their gradients arrived under the tree's
``backward`` key, each with ``backward_order`` ``[arrival, departure]`` on
one clock, and payloads named ``{path}_grad_outputs_0`` and so on.

The k-th backward call of a module is matched to its forward calls in
reverse: it gets ``call_index = forward calls - 1 - k`` (the last forward call
is differentiated first), which holds whenever every forward call takes part
in the loss.

Full backward hooks share PyTorch's limits: a module whose output is later
modified in place raises an error in backward; capture such a model with
``backward=False``. Registering full backward hooks, even ones that do
nothing, can reorder how autograd accumulates a gradient that reaches a
tensor from several places, which changes the last bits of some parameter
gradients; recording adds nothing beyond that. Forward-only capture leaves
gradients bit-identical.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from .. import format as fmt


class BackwardRecorder:
    """Holds the hooks and the backward nodes of one capture."""

    def __init__(self, model: nn.Module, root_name: str, encode: Any, forward_calls: dict[str, int],
                 on_recorded: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._encode = encode
        self._on_recorded = on_recorded  # told of a node when its gradients arrive and when it is done
        self._forward_calls = forward_calls
        self._handles: list[RemovableHandle] = []
        self._pending: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
        self._seen: defaultdict[str, int] = defaultdict(int)
        self._clock = 0
        self.nodes: list[dict[str, Any]] = []
        for name, module in model.named_modules():
            path = f"{root_name}.{name}" if name else root_name
            self._handles.append(module.register_full_backward_pre_hook(self._pre_hook(path)))
            self._handles.append(module.register_full_backward_hook(self._post_hook(path)))

    def _pre_hook(self, path: str) -> Any:
        def hook(module: nn.Module, grad_output: tuple[Any, ...]) -> None:
            k = self._seen[path]
            self._seen[path] += 1
            call_index = max(self._forward_calls.get(path, 1) - 1 - k, 0)
            prefix = fmt.call_prefix(path, call_index)
            grads = self._encode(list(grad_output), fmt.payload_name(prefix, fmt.GRAD_OUTPUTS))
            node = fmt.backward_node_entry(path, type(module).__name__, call_index, grads, self._tick())
            self._pending[path].append(node)
            self.nodes.append(node)
            if self._on_recorded is not None:
                self._on_recorded(node)

        return hook

    def _post_hook(self, path: str) -> Any:
        def hook(module: nn.Module, grad_input: tuple[Any, ...], grad_output: tuple[Any, ...]) -> None:
            if not self._pending[path]:
                return
            node = self._pending[path].pop()
            prefix = fmt.call_prefix(path, node[fmt.CALL_INDEX])
            node[fmt.GRAD_INPUTS] = self._encode(list(grad_input), fmt.payload_name(prefix, fmt.GRAD_INPUTS))
            node[fmt.BACKWARD_ORDER][1] = self._tick()
            if self._on_recorded is not None:
                self._on_recorded(node)

        return hook

    def _tick(self) -> int:
        self._clock += 1
        return self._clock - 1

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
