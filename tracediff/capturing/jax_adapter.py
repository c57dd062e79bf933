"""The Flax NNX adapter's former home: its names, kept importable from here (:mod:`.adapters.jax`)."""

from .adapters.jax import FRAMEWORK, NnxAdapter, NnxCallPatch, is_nnx_module, jax_host_copy, jax_version, nnx_modules

__all__ = ["FRAMEWORK", "NnxAdapter", "NnxCallPatch", "is_nnx_module", "jax_host_copy", "jax_version", "nnx_modules"]
