"""Where a tensor of a tensor-parallel run lives: the ``layout`` entries of a multi-rank capture.

Three sources, strongest first (``docs/trace-format.md`` section 4.1):

* a DTensor knows its placements and mesh (``source: "dtensor"``); torch's
  ``parallelize_module`` styles hand their module DTensors, so the styled
  module's own inputs and outputs are recorded as such;
* a plain tensor taken or returned by a module that transformers' ``tp_plan``
  parallelized carries the layout its style implies (``source: "style"``):
  those styles replace ``module.forward`` by a closure over the style object
  (``transformers.distributed.tensor_parallel``), read here before capture
  wraps ``forward``;
* everything else has no layout; the reader decides on evidence (``tracediff.sharding``).

Nothing here imports transformers: a style is recognised by its class names.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .. import format as fmt

# (input of args[0], output) placements of transformers' styles, as a parent module sees them
_COLWISE, _ROWWISE = "ColwiseParallel", "RowwiseParallel"


def placement_code(placement: Any) -> str | None:
    """``"S(d)"``, ``"R"`` or ``"P"`` for a torch placement (``Shard``, ``Replicate``, ``Partial``); None otherwise."""
    kind = type(placement).__name__
    if kind == "Shard":
        return fmt.shard_code(int(placement.dim))
    if kind == "Replicate":
        return fmt.REPLICATE
    if kind == "Partial" and getattr(placement, "reduce_op", "sum") == "sum":
        return fmt.PARTIAL
    return None  # _StridedShard, a max-reduction: not rebuilt by concatenation or sum


def dtensor_placements(value: Any, *, full: bool) -> dict[str, Any] | None:
    """The ``layout`` entry of a DTensor: its placements (all ``R`` when its full value is recorded)."""
    placements = list(getattr(value, "placements", ()))
    if full:
        return fmt.layout_entry([fmt.REPLICATE] * len(placements), "dtensor", global_shape=list(value.shape))
    codes = [placement_code(p) for p in placements]
    if not codes or any(code is None for code in codes):
        return None
    return fmt.layout_entry([c for c in codes if c is not None], "dtensor", global_shape=list(value.shape))


def model_mesh(model: nn.Module) -> dict[str, Any] | None:
    """The ``mesh`` of the first DTensor parameter or buffer of ``model`` (shape, dim names, this rank's
    coordinates), or None when the model holds no DTensor."""
    for tensor in (*model.parameters(), *model.buffers()):
        mesh = getattr(tensor, "device_mesh", None)
        if mesh is None:
            continue
        shape = [int(size) for size in mesh.shape]
        names = list(mesh.mesh_dim_names) if mesh.mesh_dim_names else [f"dim{i}" for i in range(len(shape))]
        coordinates = mesh.get_coordinate()
        return fmt.mesh_entry(shape, names, [int(c) for c in coordinates] if coordinates is not None else None)
    return None


def _style_of(module: nn.Module) -> Any:
    """The transformers TP style whose forward ``module`` runs (a closure cell of its ``forward``), or None."""
    forward = module.__dict__.get("forward")
    for cell in getattr(forward, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if any(cls.__name__ == "TensorParallelLayer" for cls in type(content).__mro__):
            return content
    return None


def _implied(style: Any) -> tuple[str | None, str | None]:
    """The placements of ``args[0]`` and of the output that ``style`` implies outside its forward."""
    known = (_COLWISE, _ROWWISE, "EmbeddingParallel", "SequenceParallel")
    name = next((cls.__name__ for cls in type(style).__mro__ if cls.__name__ in known), "")
    local = bool(getattr(style, "use_local_output", True))
    if name in (_COLWISE, _ROWWISE):
        return placement_code(style.input_layouts), placement_code(style.output_layouts) if local else None
    if name == "EmbeddingParallel":
        return fmt.REPLICATE, fmt.REPLICATE if local else None
    if name == "SequenceParallel":
        seq = fmt.shard_code(int(style.sequence_dim))
        return seq, seq if local else None
    return None, None  # packed, expert and reduction styles: their tensors are placed on evidence


def style_layouts(model: nn.Module, mesh: dict[str, Any] | None) -> dict[int, tuple[str | None, str | None, str]]:
    """``id(module)`` -> (placement of ``args[0]``, placement of the output, style name) for every module of
    ``model`` that a transformers TP style parallelized. Empty unless the mesh has one dimension."""
    if mesh is None or len(mesh[fmt.MESH_SHAPE]) != 1:
        return {}
    found = {}
    for module in model.modules():
        style = _style_of(module)
        if style is not None:
            taken, made = _implied(style)
            if taken is not None or made is not None:
                found[id(module)] = (taken, made, type(style).__name__)
    return found


def mark(entry: Any, placement: str | None, style: str) -> None:
    """Give the tensor entry ``entry`` the layout ``placement`` implied by ``style`` (one that has none yet)."""
    if placement is not None and fmt.is_tensor_entry(entry) and fmt.LAYOUT not in entry:
        entry[fmt.LAYOUT] = fmt.layout_entry([placement], "style", style=style)
