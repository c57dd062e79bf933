"""The key/value cache a call reads, recorded as tensors instead of the cache object's ``repr``.

transformers passes one cache object (``DynamicCache``, ``StaticCache``...) to every attention call of a
decode step, and each call reads its own layer of it (the module's ``layer_idx``). Recording that layer's
``keys`` and ``values`` as they are when the call begins makes the cache an input like any other: a cache
stored wrong in step k shows at step k + 1 as a diverging ``inputs.kwargs.cache.keys`` of the attention that
reads it (see docs/trace-format.md, section 3).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import format as fmt

KEYS, VALUES = fmt.CACHE_KEYS, fmt.CACHE_VALUES  # inputs.kwargs.cache.keys, inputs.kwargs.cache.values


def with_cache_layer(module: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with a cache argument replaced by ``{"keys": ..., "values": ...}`` of ``module``'s layer.

    Only for a module with an integer ``layer_idx`` attribute of its own and a cache whose layer holds both
    tensors already (the prefill's cache is still empty when its attention calls begin); otherwise ``kwargs``
    as given.
    """
    # the instance's own attribute: every module call passes here, and a missing attribute of an ``nn.Module``
    # costs a raised and caught AttributeError
    layer_idx = getattr(module, "__dict__", {}).get("layer_idx")
    if type(layer_idx) is not int:
        return kwargs
    for name, value in kwargs.items():
        layer = _layer(value, layer_idx)
        if layer is not None:
            return {**kwargs, name: layer}
    return kwargs


def _layer(cache: Any, index: int) -> dict[str, torch.Tensor] | None:
    layers = getattr(cache, "layers", None)  # transformers >= 4.54: one object per layer
    if isinstance(layers, (list, tuple)) and 0 <= index < len(layers):
        keys, values = getattr(layers[index], KEYS, None), getattr(layers[index], VALUES, None)
    else:
        return None
    if isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and keys.numel() and values.numel():
        return {KEYS: keys, VALUES: values}
    return None
