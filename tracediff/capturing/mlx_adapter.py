"""The MLX adapter's former home: its names, kept importable from here (:mod:`.adapters.mlx`)."""

from .adapters.mlx import (
    FRAMEWORK,
    HostArrays,
    MlxAdapter,
    MlxCallPatch,
    cast_mlx,
    check_mlx_options,
    is_mlx_array,
    is_mlx_module,
    mlx_version,
    to_mlx,
)

__all__ = ["FRAMEWORK", "HostArrays", "MlxAdapter", "MlxCallPatch", "cast_mlx", "check_mlx_options", "is_mlx_array",
           "is_mlx_module", "mlx_version", "to_mlx"]
