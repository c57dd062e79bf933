"""An optimizer's configuration and state, keyed by parameter name.

Recorded as::

    {"type": {"py_type": "str", "py_value": "torch.optim.adamw.AdamW"},
     "defaults": {"lr": {...value entry...}, "betas": {...}, ...},
     "param_groups": [{"params": {"py_value": ["fc.weight", "fc.bias"], ...}, "lr": {...}, ...}],
     "state": {"fc.weight": {"exp_avg": {...tensor entry...}, "exp_avg_sq": {...}, "step": {...}}}}

Every hyperparameter is a value entry (a tensor entry when it is a tensor, as
a ``capturable`` learning rate can be); state follows the model's parameter
order. A parameter the optimizer holds but the model does not name is called
``param_groups.{g}.{i}``. :func:`tracediff.steps.records.flatten_optimizer` gives the flat, ordered
names the comparison uses: ``type``, ``defaults.lr``, ``param_groups.0.lr``,
``state.fc.weight.exp_avg``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch

from .entries import tensor_entry, value_entry


def optimizer_snapshot(
    optimizer: torch.optim.Optimizer, names: dict[int, str], stats: Collection[str]
) -> dict[str, Any]:
    """The optimizer's type, defaults, param groups and state (``names`` maps ``id(param)`` to its name)."""
    group_names: list[list[str]] = []
    for g, group in enumerate(optimizer.param_groups):
        group_names.append([names.get(id(p), f"param_groups.{g}.{i}") for i, p in enumerate(group["params"])])
    by_name = {name: p for group, pnames in zip(optimizer.param_groups, group_names)
               for p, name in zip(group["params"], pnames)}
    order = {name: i for i, name in enumerate(names.values())}
    state: dict[str, Any] = {}
    for name in sorted(by_name, key=lambda n: order.get(n, len(order))):
        param_state = optimizer.state.get(by_name[name])
        if param_state:
            state[name] = {str(key): _entry(value, stats) for key, value in param_state.items()}
    cls = type(optimizer)
    return {
        "type": value_entry(f"{cls.__module__}.{cls.__qualname__}"),
        "defaults": {str(k): _entry(v, stats) for k, v in optimizer.defaults.items()},
        "param_groups": [
            {"params": value_entry(pnames), **{str(k): _entry(v, stats) for k, v in group.items() if k != "params"}}
            for group, pnames in zip(optimizer.param_groups, group_names)
        ],
        "state": state,
    }


def _entry(value: Any, stats: Collection[str]) -> dict[str, Any]:
    return tensor_entry(value, stats) if isinstance(value, torch.Tensor) else value_entry(value)
