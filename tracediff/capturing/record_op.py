"""``tracediff::record``: the opaque op that records a module call from inside a compiled graph.

When Dynamo traces a patched ``forward`` (:mod:`._patch`), the recorder's Python code must not be traced:
it would break the graph at every module, and what it records would be fake tensors. Instead the traced
code calls this op twice per module call::

    tracediff::record(Tensor[] tensors, Tensor(a!) order, int site, int event, str skeleton) -> ()

``site`` names the patched module (``register_site``), ``event`` is ``ENTER`` (the call's ``(args,
kwargs)``) or ``EXIT`` (its output), ``tensors`` are the tensors of that value and ``skeleton`` is the
rest of it, as JSON built while tracing (``skeleton``): numbers, strings, ``None``, lists and dicts, each
tensor as ``{"t": index}``, any other object as ``{"o": "TypeName"}``.

Every record declares that it writes one tensor, ``ORDER``: functionalization turns that into a chain of
data dependencies from each record to the next, so no graph pass drops a record (a write to a graph input
is kept) or reorders two, and inductor hands it the materialised tensor the compiled code computed, while
fusion elsewhere stays as it was. At run time its kernel rebuilds the value from the skeleton and reports
it to the site's observer, as the eager path does; a return that arrives with no call open at its site is
reported as lost (``register_site(lost=...)``), never dropped in silence.
"""

from __future__ import annotations

import functools
import itertools
import json
import threading
import weakref
from collections.abc import Callable
from types import CodeType
from typing import TYPE_CHECKING, Any

import torch

from .graph_buffers import mark

if TYPE_CHECKING:
    from .observer import CallObserver

ENTER = 0
EXIT = 1
TENSOR, NUMBER, FLOAT, STRING, OBJECT, DICT = "t", "n", "f", "s", "o", "d"


@torch.library.custom_op("tracediff::record", mutates_args=("order",))
def record(tensors: list[torch.Tensor], order: torch.Tensor, site: int, event: int, skeleton: str) -> None:
    """Report one side of a module call (see the module docstring); never raises into the forward."""
    entry = _SITES.get(site)
    if entry is not None:
        entry.receive(event, tensors, skeleton)


@record.register_fake
def _record_fake(tensors: list[torch.Tensor], order: torch.Tensor, site: int, event: int, skeleton: str) -> None:
    return None


# What every record writes (declared, never changed): functionalization makes each record read the version of
# ``ORDER`` the previous record wrote, a data dependency that no compiler pass can reorder. An ordered effect
# is not enough: inductor (torch 2.13) files the effect's ordering edge under a name its scheduler never looks
# up (pytorch/pytorch#188301), so its memory-planning reorder (reorder_for_peak_memory, on by default) moved
# the records of stock transformers models out of program order.
ORDER = torch.zeros(1)


class Opaque:
    """An object the compiled graph did not keep (a cache, a config): recorded by its type name only."""

    type_name = "object"

    def __repr__(self) -> str:
        return f"{self.type_name}(not visible inside a compiled graph)"


@functools.lru_cache(maxsize=256)
def _opaque_type(name: str) -> type[Opaque]:
    # A class named after the original type, so that the trace's ``py_type`` names what the model passed.
    return type(name, (Opaque,), {"type_name": name})


#: Told of a call that ran and whose record cannot be placed: ``lost(path, call_index or None, why)``.
Lost = Callable[[str, int | None, str], None]
RETURN_WITHOUT_START = "its return was recorded without its start: the call is missing from the tree"


class _Site:
    """One patched module: where its records go, the tokens of its calls still open, and its returns that
    came with no call open (``orphans``; a start that comes after one is the same call, out of order)."""

    def __init__(self, module: Any, path: str, observer: CallObserver, lost: Lost | None) -> None:
        self.module = module
        self.path = path
        self.observer = observer
        self.lost = lost
        self.open: list[Any] = []
        self.orphans = 0

    def receive(self, event: int, tensors: list[torch.Tensor], skeleton: str) -> None:
        try:
            # detach(): a fresh tensor object each time. Inductor reuses buffers in place, so the same object
            # may hold another value at the next record; a fresh object is never taken for one seen unchanged,
            # and a buffer is taken for a value written before only on the evidence of its bytes (graph_buffers).
            value = rebuild(skeleton, [mark(t.detach()) for t in tensors])
        except Exception:  # noqa: BLE001 - a skeleton we cannot read still records the tensors
            value = [mark(t.detach()) for t in tensors]
        if event == ENTER:
            args, kwargs = _call_arguments(value)
            self.open.append(self.observer.enter(self.module, self.path, args, kwargs))
            # the return that came first: this call is left open, and counted when its caller returns
            self.orphans = max(0, self.orphans - 1)
        elif self.open:
            self.observer.exit(self.open.pop(), value)
        else:
            self.orphans += 1

    def release(self) -> None:
        """Report the returns that never met their start (called once, when the capture ends)."""
        if self.lost is not None:
            for _ in range(self.orphans):
                self.lost(self.path, None, RETURN_WITHOUT_START)
        self.orphans = 0


_SITES: dict[int, _Site] = {}  # the sites of the captures under way
# module -> (attribute, path) -> its site number, the same in every capture: the number is a constant of the
# graph, and Dynamo guards on it, so a model captured again runs the graph compiled for the first capture.
_SITE_NUMBERS: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], int]] = weakref.WeakKeyDictionary()
_SITE_CODES: dict[int, CodeType] = {}
_NEXT_SITE = itertools.count()
_SITES_LOCK = threading.Lock()


def register_site(module: Any, path: str, observer: CallObserver, attribute: str = "forward",
                  lost: Lost | None = None) -> int:
    """The site number of ``module``'s ``attribute`` at ``path``, reporting to ``observer`` until released."""
    with _SITES_LOCK:
        numbers = _SITE_NUMBERS.setdefault(module, {})
        site = numbers.get((attribute, path))
        if site is None:
            site = numbers[(attribute, path)] = next(_NEXT_SITE)
        _SITES[site] = _Site(module, path, observer, lost)
    return site


def site_code(site: int, code: CodeType) -> CodeType:
    """The code object of ``site``'s wrapper: one per site, the same in every capture.

    Dynamo keeps the variants it compiled per code object. A frame that starts at a wrapper (after a graph
    break) would otherwise count every module against one recompile limit, and a wrapper made with new
    code at each capture would be compiled anew at each capture."""
    with _SITES_LOCK:
        return _SITE_CODES.setdefault(site, code.replace())


def release_sites(sites: list[int]) -> None:
    """Stop reporting the records of ``sites`` (a graph compiled during a capture may still run them); report
    their returns that never met their start as lost."""
    with _SITES_LOCK:
        released = [_SITES.pop(site, None) for site in sites]
    for entry in released:
        if entry is not None:
            entry.release()


def _call_arguments(value: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(value, list) and len(value) == 2 and isinstance(value[1], dict):
        return tuple(value[0]), value[1]
    return (value,), {}


# --- traced by Dynamo -------------------------------------------------------------------------------------
# Plain Python on constants, which Dynamo evaluates while tracing: the skeleton is a constant of the graph.


def skeleton(value: Any, tensors: list[torch.Tensor]) -> str:
    """The JSON skeleton of ``value``; its tensors are appended to ``tensors`` in order."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return '{"t":' + str(len(tensors) - 1) + "}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return '{"n":' + str(value) + "}"
    if isinstance(value, float):
        return '{"f":"' + repr(value) + '"}'  # a string: inf and nan are not JSON numbers
    if isinstance(value, str):
        return '{"s":' + _quoted(value) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join([skeleton(item, tensors) for item in value]) + "]"
    if isinstance(value, dict):
        items = [_quoted(str(key)) + ":" + skeleton(item, tensors) for key, item in value.items()]
        return '{"d":{' + ",".join(items) + "}}"
    return '{"o":' + _quoted(type(value).__name__) + "}"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


def recorded_in_graph(site: int, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
                      ) -> Any:
    """``original(*args, **kwargs)`` with its call recorded through ``tracediff::record`` (traced by Dynamo)."""
    tensors: list[torch.Tensor] = []
    shape = skeleton([list(args), kwargs], tensors)
    torch.ops.tracediff.record(tensors, ORDER, site, ENTER, shape)
    out = original(*args, **kwargs)
    tensors = []
    shape = skeleton(out, tensors)
    torch.ops.tracediff.record(tensors, ORDER, site, EXIT, shape)
    return out


# --- at run time ------------------------------------------------------------------------------------------


def rebuild(text: str, tensors: list[torch.Tensor]) -> Any:
    """The value a skeleton describes, its tensors taken from ``tensors``."""
    return _fill(_parsed(text), tensors)


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> Any:
    return json.loads(text)


def _fill(node: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(node, list):
        return [_fill(item, tensors) for item in node]
    if not isinstance(node, dict):
        return node  # None, True, False
    if TENSOR in node:
        return tensors[node[TENSOR]]
    if NUMBER in node:
        return node[NUMBER]
    if FLOAT in node:
        return float(node[FLOAT])
    if STRING in node:
        return node[STRING]
    if DICT in node:
        return {key: _fill(item, tensors) for key, item in node[DICT].items()}
    return _opaque_type(str(node.get(OBJECT, "object")))()
