"""The torch adapter: every ``nn.Module`` call of a model, through its ``forward`` (:mod:`.._patch`).

torch supports every capture option (op-level capture, backward, ``verify``, decode steps, teacher forcing,
DTensors): those are the capture core's own, built on torch, and ``supported_options`` says so. Tensors are
the recorder's own kind, so ``host`` leaves them as they are.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from ..signatures import forward_parameters
from .base import GATED_OPTIONS, AdapterBase, Installed, Recorder

FRAMEWORK = "torch"


class TorchAdapter(AdapterBase):
    framework = FRAMEWORK
    models = "torch"
    supported_options = frozenset(GATED_OPTIONS)

    def recognises(self, model: Any) -> bool:
        module_type = getattr(sys.modules.get("torch.nn"), "Module", None)
        return isinstance(module_type, type) and isinstance(model, module_type)

    def version(self) -> str | None:
        return getattr(sys.modules.get("torch"), "__version__", None)

    def install(self, model: Any, recorder: Recorder, options: Mapping[str, Any]) -> Installed:
        from .._patch import ForwardPatch

        # compiled="regions": compiled regions entered from outside, nothing inside them touched (compiled.py);
        # a record of compiled code that cannot be placed is counted by the capture's recorder (session.py)
        return ForwardPatch(model, recorder.observer, root_name=recorder.model_name,
                            compiled_regions_only=options.get("compiled") == "regions",
                            lost=recorder.call_lost)

    def host(self, value: Any) -> Any:
        return value

    def metadata(self, model: Any) -> dict[str, Any]:
        return {"forward_parameters": forward_parameters(model.modules(), method="forward")}

    def measure(self) -> Callable[..., dict[str, Any]] | None:
        return None  # torch's own statistics (tensor_stats, device statistics on accelerators)

    def is_array(self, value: Any) -> bool:
        tensor_type = getattr(sys.modules.get("torch"), "Tensor", None)
        return isinstance(tensor_type, type) and isinstance(value, tensor_type)

    def prepare(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, dtype: Any, device: Any
                ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        from ..conditions import to_conditions

        return to_conditions(model, args, kwargs, dtype=dtype, device=device)
