"""An ExecuTorch run's debug outputs as graph nodes: each one's edge node, module scopes and sources.

* A kernel call's instruction maps (ETRecord ``debug_handle_map``) to a debug handle, and that to the edge
  node(s) carrying it; among those, the node whose op is the kernel's (``mm`` for ``mm.out``) is chosen.
* A delegate call's instruction maps to the handles of all the edge nodes it runs. Its outputs are the values
  those nodes hand to a node outside them (or the method's outputs), in graph order; checked against the
  outputs' count and shapes, else left unnamed.
* Sources are edge values, followed through what ran as no instruction (a memory-planned ``view_copy``).
* A module is shown only where the run shows its boundary: a module some of whose outputs were computed
  inside a delegate and never left it (or whose recorded outputs are not its own) is dropped from the scope
  chains, so that its nodes belong to the module around it. The alignment never compares a call whose
  output it cannot see.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .executorch_files import DebugOutput, EdgeNode, EtRecord

#: (backend, op, string argument, its value) -> the name of the approximation its kernel makes there.
KernelForms = Mapping[tuple[str, str, str, str], str]


@dataclass(frozen=True)
class PlannedNode:
    """What ``record_node`` is handed for one debug output."""

    key: str
    name: str
    op: str
    scopes: tuple[str, ...]
    data: Any
    sources: tuple[str, ...]
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Delegated:
    backend: str
    outputs: tuple[str | None, ...]  # the edge values its outputs are, in order (None: not known)
    first: int  # the index of its first output among the call's logged arguments
    sources: tuple[tuple[str, ...], ...]  # per output: the values from outside the region it was computed from
    scope: tuple[str, ...]  # what all its ops share
    ops: int
    op_names: tuple[str, ...]  # the edge ops it runs, each once
    forms: tuple[tuple[dict[str, str], ...], ...] = ()  # per output: the kernel forms acting on it (KernelForms)


class NodePlan:
    """The graph nodes of one run's debug outputs (see the module docstring)."""

    def __init__(self, record: EtRecord, outputs: Sequence[DebugOutput], views: Iterable[str],
                 delegate_calls: Mapping[int, tuple[int, tuple[tuple[int, ...], ...]]] | None = None,
                 forms: KernelForms | None = None) -> None:
        self.record, self.outputs, self.views = record, list(outputs), frozenset(views)
        self.forms = dict(forms or {})
        self.delegate_calls = dict(delegate_calls or {})
        self._order = {id(node): i for i, node in enumerate(record.nodes)}
        self._pool: dict[int, list[EdgeNode]] = {}  # handle -> its nodes no instruction has claimed yet
        self._recorded: set[str] = set()
        self._resolved: dict[str, tuple[str, ...]] = {}
        self._paired = self._pair({o.instruction: o.kernel or "" for o in self.outputs},
                                  {o.instruction: tuple(o.data.shape) for o in reversed(self.outputs)
                                   if o.index == 0 and o.data is not None})
        self.counts = {"debug_events": len(self.outputs), "with_data": 0, "recorded": 0, "without_module": 0,
                       "delegate_inputs": 0}
        self.hidden_modules: list[str] = []
        self._delegated_scopes: set[str] = set()  # the modules of the edge nodes delegates ran

    def nodes(self) -> list[PlannedNode]:
        """The nodes in the edge program's order, their scope chains left only with modules whose boundary
        shows."""
        planned: list[PlannedNode] = []
        regions: dict[int, _Delegated] = {}
        handed: list[PlannedNode] = []  # the open delegate call's outputs
        for output in self.outputs:
            if handed and output.instruction != handed[0].attributes["instruction"]:
                planned.extend(handed)
                handed = []
            if output.data is None:
                continue
            self.counts["with_data"] += 1
            backend = self.record.delegates.get(output.instruction)
            if backend is None:
                node = self._kernel(output)
                self._recorded.add(node.key)
                planned.append(node)
                continue
            if output.instruction not in regions:
                regions[output.instruction] = self._region(output.instruction, backend)
            region = regions[output.instruction]
            if output.index < region.first:  # an input of the call, recorded where it was computed
                self.counts["delegate_inputs"] += 1
                continue
            node = self._delegated(output, region)
            self._recorded.add(node.key)
            handed.append(node)
        planned = self._in_graph_order([*planned, *handed])
        self.counts["recorded"] = len(planned)
        hidden = self._hidden(planned)
        shown = [replace(node, scopes=tuple(s for s in node.scopes if s not in hidden)) if hidden else node
                 for node in planned]
        # a module all of whose work ran inside delegates and none of whose values left them shows nowhere
        absent = self._delegated_scopes - {scope for node in shown for scope in node.scopes}
        self.hidden_modules = sorted(hidden | absent)
        return shown

    def _in_graph_order(self, nodes: list[PlannedNode]) -> list[PlannedNode]:
        """``nodes`` in the edge program's order: a topological order that follows the modules, where the
        program may run a later layer's kernels between a delegate's calls. A node of no edge node stays
        after the one before it."""
        keys: list[int] = []
        last = -1
        for node in nodes:
            producer = self.record.producers.get(node.key)
            last = self._order[id(producer[0])] if producer is not None else last
            keys.append(last)
        return [node for _, _, node in sorted(zip(keys, range(len(nodes)), nodes), key=lambda item: item[:2])]

    def _pair(self, kernels: Mapping[int, str], shapes: Mapping[int, tuple[int, ...]]) -> dict[int, EdgeNode]:
        """Each kernel call's edge node: among those of its debug handle not yet taken (a decomposed op's
        nodes share one), the first of the kernel's op and output shape, else of its op, else the first."""
        by_handle = self._pool
        for node in self.record.nodes:
            if node.handle is not None:
                by_handle.setdefault(node.handle, []).append(node)
        paired: dict[int, EdgeNode] = {}
        for instruction in sorted(kernels):
            handle = self.record.handles.get(instruction)
            if instruction in self.record.delegates or not isinstance(handle, int):
                continue
            candidates = by_handle.get(handle, [])
            kernel = kernels[instruction].split(".")[0]
            shape = shapes.get(instruction)
            chosen = next((n for n in candidates if n.short == kernel and n.outputs
                           and self.record.shapes.get(n.outputs[0]) == shape), None) \
                or next((n for n in candidates if n.short == kernel), candidates[0] if candidates else None)
            if chosen is not None:
                paired[instruction] = chosen
                candidates.remove(chosen)
        return paired

    def _kernel(self, output: DebugOutput) -> PlannedNode:
        node = self._paired.get(output.instruction)
        kernel = output.kernel or "?"
        attributes: dict[str, Any] = {"instruction": output.instruction, "kernel": kernel}
        if node is None:
            self.counts["without_module"] += 1
            return PlannedNode(f"instruction{output.instruction}:{output.index}", kernel.split(".")[0], kernel, (),
                               output.data, (), attributes)
        key = node.outputs[output.index] if output.index < len(node.outputs) else f"{node.name}:{output.index}"
        attributes.update(debug_handle=node.handle, edge_node=node.name)
        if output.index:
            attributes["output"] = output.index
        sources = tuple(dict.fromkeys(s for name in node.inputs for s in self._resolve(name)))
        return PlannedNode(key, node.short, node.op, node.scopes, output.data, sources, attributes)

    def _delegated(self, output: DebugOutput, region: _Delegated) -> PlannedNode:
        index = output.index - region.first
        value = region.outputs[index] if index < len(region.outputs) else None
        key = value or f"{region.backend}@{output.instruction}:{output.index}"
        producer = self.record.producers.get(value) if value else None
        attributes: dict[str, Any] = {"delegate": region.backend, "instruction": output.instruction,
                                      "output": index, "delegated_ops": region.ops, "ops": list(region.op_names),
                                      "delegate_scope": region.scope[-1] if region.scope else ""}
        if producer is not None:
            attributes.update(value=key, produced_by=producer[0].op)
        if index < len(region.forms) and region.forms[index]:
            attributes["approximations"] = [dict(form) for form in region.forms[index]]
        scopes = producer[0].scopes if producer is not None else region.scope
        sources = region.sources[index] if index < len(region.sources) else ()
        return PlannedNode(key, region.backend, region.backend, scopes, output.data, sources, attributes)

    def _region(self, instruction: int, backend: str) -> _Delegated:
        """A delegate call's region in the edge program and the values it hands out.

        Its ops: as many nodes of each debug handle as the ETRecord lists for the call, the first ones no
        earlier instruction claimed (a decomposed op's nodes share one handle). Its outputs: the values those
        nodes hand to a node outside them (or the method's outputs), matched by shape, in order, to the
        outputs the program's delegate call writes."""
        handle = self.record.handles.get(instruction)
        wanted: dict[int, int] = {}
        for h in handle if isinstance(handle, list) else [handle] if handle is not None else []:
            wanted[h] = wanted.get(h, 0) + 1
        members: list[EdgeNode] = []
        for h, count in wanted.items():
            pool = self._pool.get(h, [])
            members.extend(pool[:count])
            del pool[:count]
        members.sort(key=lambda node: self._order[id(node)])
        self._delegated_scopes.update(scope for node in members for scope in node.scopes)
        ids = {id(node) for node in members}
        inside = {name for node in members for name in node.outputs}
        read_outside = {name for node in self.record.nodes if id(node) not in ids for name in node.inputs}
        read_outside.update(self.record.graph_outputs)
        candidates = [name for node in members for name in node.outputs if name in read_outside]
        events = [o for o in self.outputs if o.instruction == instruction]
        first, shapes = self.delegate_calls.get(instruction, (len(events) - len(candidates), ()))
        if not shapes:  # no split from the program: the outputs' own shapes
            shapes = tuple(tuple(o.data.shape) if o.data is not None else () for o in events[max(first, 0):])
        outs: list[str | None] = []
        for shape in shapes:
            match = next((name for name in candidates if self.record.shapes.get(name) == shape), None)
            if match is not None:
                candidates.remove(match)
            outs.append(match)
        handed = {name for name in outs if name}
        sources = tuple(self._region_reads(name, inside, handed) if name else () for name in outs)
        forms = tuple(self._forms(backend, name, inside, handed) if name else () for name in outs)
        return _Delegated(backend, tuple(outs), max(first, 0), sources,
                          common_scope([node.scopes for node in members]), len(members),
                          tuple(sorted({node.op for node in members}))[:64], forms)

    def _forms(self, backend: str, output: str, inside: set[str], handed: set[str]) -> tuple[dict[str, str], ...]:
        """The kernel forms (``forms``: the backend computes another function than the op asks) acting on a
        delegate's output ``output``: those of the region's nodes it was computed from, in graph order."""
        if not self.forms:
            return ()
        found: dict[int, dict[str, str]] = {}  # graph order -> the form
        seen: set[str] = set()
        stack = [output]
        while stack:
            name = stack.pop()
            if name in seen or name not in inside or (name in handed and name != output):
                continue
            seen.add(name)
            producer = self.record.producers.get(name)
            if producer is None:
                continue
            node = producer[0]
            for argument, value in node.strings:
                kind = self.forms.get((backend, node.op, argument, value))
                if kind is not None:
                    found[self._order[id(node)]] = {"name": kind, "op": node.op, argument: value,
                                                     "scope": node.scopes[-1] if node.scopes else ""}
            stack.extend(node.inputs)
        return tuple(found[order] for order in sorted(found))

    def _region_reads(self, output: str, inside: set[str], handed: set[str]) -> tuple[str, ...]:
        """What a delegate's output ``output`` was computed from: values from outside its region, or other
        outputs of the region (``handed``), the nearest ones."""
        reads: list[str] = []
        seen: set[str] = set()
        stack = [output]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name not in inside or (name in handed and name != output):
                reads.append(name)
                continue
            producer = self.record.producers.get(name)
            if producer is not None:
                stack.extend(reversed(producer[0].inputs))
        return tuple(dict.fromkeys(s for name in reads for s in ((name,) if name in handed else self._resolve(name))))

    def _resolve(self, name: str) -> tuple[str, ...]:
        """What a node reading ``name`` read among the recorded values: ``name`` itself when recorded or
        external, else (a view that ran as no instruction, an output without data) what its producer read."""
        if name in self._recorded:
            return (name,)
        done = self._resolved.get(name)
        if done is not None:
            return done
        producer = self.record.producers.get(name)
        if producer is None:
            return (name,)
        self._resolved[name] = (name,)  # a graph has no cycle; this bounds a damaged one
        found = tuple(dict.fromkeys(s for source in producer[0].inputs for s in self._resolve(source)))
        self._resolved[name] = found or (name,)
        return self._resolved[name]

    def _through_views(self, name: str) -> str | None:
        """The recorded value ``name`` is (following views that ran as no instruction), or None."""
        for _ in range(64):
            if name in self._recorded:
                return name
            producer = self.record.producers.get(name)
            if producer is None or producer[0].op not in self.views or not producer[0].inputs:
                return None
            name = producer[0].inputs[0]
        return None

    def _hidden(self, planned: Sequence[PlannedNode]) -> set[str]:
        """The modules whose recorded outputs or inputs are not theirs in the edge program."""
        read_by: dict[str, list[tuple[str, ...]]] = {}
        for node in planned:
            for source in node.sources:
                read_by.setdefault(source, []).append(node.scopes)
        results = {self._through_views(name) or name for name in self.record.graph_outputs}
        shown: dict[str, set[str]] = {}
        for node in planned:
            for module in node.scopes:
                outside = node.key in results or any(module not in chain for chain in read_by.get(node.key, ()))
                members = shown.setdefault(module, set())
                if outside:
                    members.add(node.key)
        consumers: dict[str, list[tuple[str, ...]]] = {}
        for edge in self.record.nodes:
            for name in edge.inputs:
                consumers.setdefault(name, []).append(edge.scopes)
        truth: dict[str, set[str | None]] = {}
        for edge in self.record.nodes:
            for module in edge.scopes:
                if module not in shown:
                    continue
                for name in edge.outputs:
                    if name in self.record.graph_outputs or any(module not in c for c in consumers.get(name, ())):
                        truth.setdefault(module, set()).add(self._through_views(name))
        scopes_of = {node.key: node.scopes for node in planned}
        shown_in: dict[str, set[str | None]] = {}
        for node in planned:
            for module in node.scopes:
                shown_in.setdefault(module, set()).update(
                    source for source in node.sources if source in scopes_of and module not in scopes_of[source])
        truth_in: dict[str, set[str | None]] = {}
        for edge in self.record.nodes:
            for module in edge.scopes:
                if module not in shown:
                    continue
                for name in edge.inputs:
                    producer = self.record.producers.get(name)
                    if producer is not None and module not in producer[0].scopes:
                        truth_in.setdefault(module, set()).add(self._through_views(name))
        return {module for module, keys in shown.items()
                if None in truth.get(module, set()) or truth.get(module, set()) != keys
                or shown_in.get(module, set()) != truth_in.get(module, set())}


def common_scope(chains: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    """The scopes all ``chains`` share, outermost first."""
    shared: list[str] | None = None
    for chain in chains:
        if not chain:
            continue
        if shared is None:
            shared = list(chain)
            continue
        n = 0
        while n < min(len(shared), len(chain)) and shared[n] == chain[n]:
            n += 1
        shared = shared[:n]
    return tuple(shared or ())


__all__ = ["NodePlan", "PlannedNode", "common_scope"]
