"""JSON-safe values: NaN as null, infinities as strings (no heavy imports, shared by the renderers)."""

from __future__ import annotations

import math
from typing import Any


def strict_json_value(value: Any) -> Any:
    """Replace NaN by None and infinities by strings, recursively."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {k: strict_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json_value(v) for v in value]
    return value
