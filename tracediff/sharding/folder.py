"""Reading a multi-rank folder: its manifest, its ``rank{r}/`` traces, and the checks that they are one run.

A folder is multi-rank when it holds ``tracediff_ranks.json``, or (captures
older than format 1.4) ``rank{r}/`` folders that each hold a trace. Refused
with ``TraceFormatError`` (exit code 2), naming the folder: a rank folder the
manifest names that is missing, rank folders that are not ``rank0`` to
``rank{N-1}``, ranks whose metadata disagree with the manifest (or with rank
0) on the world size, the run's start time or the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import format as fmt
from ..errors import TraceFormatError
from ..files.confine import read_json_file, resolve_inside
from ..trace.load import Trace, load_trace
from ..trace.ranks import rank_folders


@dataclass(frozen=True)
class RankSet:
    """The traces of one multi-rank run, rank 0 first, and the mesh they ran on."""

    folder: Path
    traces: tuple[Trace, ...]
    mesh_shape: tuple[int, ...]
    dim_names: tuple[str, ...]
    coordinates: tuple[tuple[int, ...], ...]  # each rank's coordinates on the mesh
    run_started: str | None


def read_ranks(path: str | Path) -> RankSet:
    """Load every rank of the multi-rank folder ``path`` after checking that they belong to one run."""
    folder = Path(path)
    manifest = _manifest(folder)
    names = manifest.get("ranks")
    world = manifest.get("world_size")
    if type(world) is not int or world < 1:
        raise TraceFormatError(f"{folder / fmt.RANKS_FILE}: 'world_size' must be a positive integer, got "
                               f"{_short(world)}")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) \
            or len(names) != world or names != [fmt.rank_folder(r) for r in range(world)]:
        raise TraceFormatError(f"{folder / fmt.RANKS_FILE}: 'ranks' must name rank0 to rank{{world_size-1}}")
    traces = []
    for name in names:
        rank_dir = resolve_inside(folder, name, what="rank folder")
        if not rank_dir.is_dir():
            raise TraceFormatError(f"{folder}: rank folder {name} is missing (the run had {world} ranks)")
        traces.append(load_trace(rank_dir))
    started = manifest.get("run_started")
    model = manifest.get("model_name")
    for rank, trace in enumerate(traces):
        meta = trace.metadata
        for key, expected in (("world_size", world), ("run_started", started), ("model_name", model),
                              ("rank", rank)):
            found = meta.get(key)
            if meta and found != expected:
                raise TraceFormatError(f"{folder / names[rank]}: from another run: its {key} {found!r} differs "
                                       f"from the run's {expected!r}")
    mesh = manifest.get("mesh") if isinstance(manifest.get("mesh"), dict) else None
    shape = tuple(mesh[fmt.MESH_SHAPE]) if mesh and _ints(mesh.get(fmt.MESH_SHAPE)) else (world,)
    dim_names = mesh.get(fmt.MESH_DIM_NAMES) if mesh else None
    names_ok = isinstance(dim_names, list) and len(dim_names) == len(shape) and all(isinstance(n, str)
                                                                                     for n in dim_names)
    if math.prod(shape) != world:
        raise TraceFormatError(f"{folder / fmt.RANKS_FILE}: a mesh of shape {list(shape)} does not hold "
                               f"{world} ranks")
    coordinates = tuple(_coordinates(trace, rank, shape) for rank, trace in enumerate(traces))
    if len(set(coordinates)) != world:
        raise TraceFormatError(f"{folder}: two ranks claim the same mesh coordinates")
    names_found: list[str] = dim_names if names_ok and isinstance(dim_names, list) else ["world"] * len(shape)
    return RankSet(folder, tuple(traces), shape, tuple(names_found),
                   coordinates, started if isinstance(started, str) else None)


def _manifest(folder: Path) -> dict[str, Any]:
    """The manifest, or one made from the rank folders' metadata (captures without a manifest)."""
    path = folder / fmt.RANKS_FILE
    if path.exists():
        manifest = read_json_file(path, root=folder, what="ranks manifest")
        if not isinstance(manifest, dict):
            raise TraceFormatError(f"{path}: not a JSON object")
        fmt.check_format_version(manifest, path)
        return manifest
    found = rank_folders(folder)
    first = load_trace(found[0]).metadata if found else {}
    world = first.get("world_size")
    if type(world) is not int or world < 1:
        raise TraceFormatError(f"{folder}: rank folders without {fmt.RANKS_FILE} or a world size in their metadata")
    return {"world_size": world, "ranks": [fmt.rank_folder(r) for r in range(world)],
            "run_started": first.get("run_started"), "model_name": first.get("model_name")}


def _coordinates(trace: Trace, rank: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    mesh = trace.metadata.get("mesh")
    found = mesh.get(fmt.MESH_COORDINATES) if isinstance(mesh, dict) else None
    if isinstance(found, list) and _ints(found) and len(found) == len(shape) and \
            all(0 <= c < n for c, n in zip(found, shape)):
        return tuple(found)
    if len(shape) == 1:
        return (rank,)
    raise TraceFormatError(f"{trace.directory}: no mesh coordinates for rank {rank} of a {len(shape)}-D mesh")


def _short(value: Any) -> str:
    """``value``'s repr, cut to one short line (a manifest may hold anything)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _ints(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(v) is int and v >= 0 for v in value)

