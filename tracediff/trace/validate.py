"""Checking the field types of a trace's JSON tree as it is read, so that a crafted trace is refused in one line.

The reader (:mod:`tracediff.trace.load`) walks the tree once: it passes
every node and every tensor entry through :class:`TreeChecker` before
building anything from it, and trusts what was let through. The rules: every
node is an object with a string ``module_path``; ``call_index`` is a
non-negative integer (or absent); ``module_type`` a string; ``error`` an
object of strings; ``children``, ``subsequent_calls`` and ``backward``
lists; backward entries have an integer ``call_index`` and a
``backward_order`` of two integers or nulls; a tensor entry's ``shape`` has
at most 64 dimensions of at most 18 digits, its ``stats`` is an object whose
counts are non-negative integers and whose other values are numbers
(integers within 64 bits). Anything else raises ``TraceFormatError`` naming
the file, the node and the field.

A tensor entry's ``value`` that is neither a payload path nor repr lines is
not refused: :func:`value_problem` says why, and that row is compared on its
recorded statistics with the reason shown.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .. import format as fmt
from ..errors import TraceFormatError
from .model import Node, StepTokens

_MAX_DIMS = 64
_DIM = re.compile(r"\d+")
_INT64 = 1 << 63
_MAX_CALL_INDEX = 1 << 31
_COUNTS = frozenset(fmt.COUNT_STAT_KEYS)
_STATS = frozenset(fmt.STAT_KEYS)


def _int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _token_ids(value: Any, *, empty: bool = False) -> bool:
    """True for a list of token ids (whole numbers, 0 or more), not empty unless ``empty``."""
    return isinstance(value, list) and (empty or bool(value)) and all(_int_in(v, 0, _INT64) for v in value)


def value_problem(value: Any) -> str | None:
    """Why a tensor entry's ``value`` cannot be used (None when it is absent, a path, or a list of repr lines)."""
    if value is None or isinstance(value, str):
        return None
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return None
    kind = {bool: "a boolean", int: "a number", float: "a number", dict: "an object", list: "a list of non-strings"}
    return (f"the trace's 'value' is {kind.get(type(value), type(value).__name__)}, not a payload path; "
            "compared on its recorded statistics")


class TreeChecker:
    """The checks of one trace JSON, called by the reader on each part before it is used."""

    def __init__(self, json_path: Path) -> None:
        self.json_path = json_path

    def fail(self, where: str, problem: str) -> TraceFormatError:
        return TraceFormatError(f"{self.json_path}: {where}: {problem}")

    def top(self, tree: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        """The top-level ``subsequent_calls`` and ``backward`` lists (empty when absent)."""
        later = tree.get(fmt.SUBSEQUENT_CALLS)
        if later is not None and not isinstance(later, list):
            raise self.fail(fmt.SUBSEQUENT_CALLS, f"is {type(later).__name__}; expected a list of nodes")
        backward = tree.get(fmt.BACKWARD)
        if backward is not None and not isinstance(backward, list):
            raise self.fail(fmt.BACKWARD, f"is {type(backward).__name__}; expected a list of nodes")
        return later or [], backward or []

    def node(self, node: Any, parent: str) -> list[Any]:
        """Check a forward node's own fields (not its values); returns its ``children`` list."""
        if type(node) is not dict or type(node.get(fmt.MODULE_PATH)) is not str:
            raise TraceFormatError(f"{self.json_path}: a child of {parent} is not a node (no 'module_path')")
        self.node_fields(node)
        children = node.get(fmt.CHILDREN)
        if children is None:
            return []
        if type(children) is not list:
            raise TraceFormatError(f"{self.json_path}: 'children' of {node[fmt.MODULE_PATH]} is not a list")
        return children

    def step(self, node: dict[str, Any]) -> int | None:
        """The decode step of a top-level call (``step``), None when it has none; refused unless a count."""
        step = node.get(fmt.STEP)
        if step is not None and not (type(step) is int and 0 <= step < _MAX_CALL_INDEX):
            raise self.fail(node[fmt.MODULE_PATH], f"'step' is {step!r:.40}; expected a whole number, 0 or more")
        return step

    def tokens(self, node: dict[str, Any], step: int | None) -> StepTokens | None:
        """The tokens of a decode step (``tokens``), None when it has none; refused unless as the format says."""
        found = node.get(fmt.TOKENS)
        if found is None:
            return None
        where = node[fmt.MODULE_PATH]
        if step is None or type(found) is not dict:
            raise self.fail(where, "'tokens' belongs to a decode step (with 'step') and is an object")
        chosen, argmax = found.get(fmt.TOKENS_CHOSEN), found.get(fmt.TOKENS_ARGMAX)
        if not (isinstance(chosen, list) and isinstance(argmax, list) and _token_ids(chosen) and _token_ids(argmax)
                and len(chosen) == len(argmax)):
            raise self.fail(where, f"'tokens' of step {step}: 'chosen' and 'argmax' are not lists of token ids of "
                                   "one length")
        prompt, vocab = found.get(fmt.TOKENS_PROMPT), found.get(fmt.TOKENS_VOCAB_SIZE)
        if step != 0 and (prompt is not None or vocab is not None):
            raise self.fail(where, f"'tokens' of step {step}: 'prompt' and 'vocab_size' belong to step 0")
        if prompt is not None and not (isinstance(prompt, list) and all(_token_ids(p, empty=True) for p in prompt)):
            raise self.fail(where, "'tokens' of step 0: 'prompt' is not a list of token-id lists")
        if vocab is not None and not _int_in(vocab, 1, _INT64):
            raise self.fail(where, f"'tokens' of step 0: 'vocab_size' is {vocab!r:.40}; expected a whole number")
        return StepTokens(tuple(chosen), tuple(argmax), found.get(fmt.TOKENS_FORCED) is True,
                          tuple(tuple(p) for p in prompt) if prompt is not None else None, vocab)

    def backward_entry(self, i: int, entry: Any) -> None:
        """Check backward entry ``i`` (its own fields; its tensors are checked as they are read)."""
        if not isinstance(entry, dict) or not isinstance(entry.get(fmt.MODULE_PATH), str):
            raise self.fail(f"backward entry {i}", "is not an object with a string 'module_path'")
        where = f"backward entry {i} ({entry[fmt.MODULE_PATH]})"
        if not _int_in(entry.get(fmt.CALL_INDEX, 0), 0, _MAX_CALL_INDEX):
            raise self.fail(where, f"'call_index' is {entry.get(fmt.CALL_INDEX)!r:.40}; expected a whole number")
        order = entry.get(fmt.BACKWARD_ORDER)
        if order is not None and not (isinstance(order, list) and len(order) <= 2
                                      and all(o is None or _int_in(o, 0, _INT64) for o in order)):
            raise self.fail(where, f"'backward_order' is {order!r:.40}; expected [arrival, departure] numbers")
        self.node_fields(entry)

    def node_fields(self, node: dict[str, Any]) -> None:
        call_index = node.get(fmt.CALL_INDEX)
        if call_index is not None and not (type(call_index) is int and 0 <= call_index < _MAX_CALL_INDEX):
            raise self.fail(node[fmt.MODULE_PATH], f"'call_index' is {call_index!r:.40}; expected a whole number")
        if fmt.SOURCES in node and fmt.OP in node:  # else read as an op of its parent, and never compared
            raise self.fail(node[fmt.MODULE_PATH], "has both 'sources' and 'op'; a graph node is a call (its op "
                                                   "is its 'module_type'), never an op node")
        module_type = node.get(fmt.MODULE_TYPE)
        if module_type is not None and type(module_type) is not str:
            raise self.fail(node[fmt.MODULE_PATH],
                            f"'module_type' is {type(module_type).__name__}; expected a string")
        error = node.get(fmt.ERROR)
        if error is not None and not (isinstance(error, dict) and all(isinstance(v, (str, int, type(None)))
                                                                      for v in error.values())):
            raise self.fail(node[fmt.MODULE_PATH],
                            f"'error' is {type(error).__name__}; expected an object with 'type' and 'message'")

    def tensor(self, entry: dict[str, Any], node: Node) -> dict[str, Any] | None:
        """Check a tensor entry of ``node``; returns its numeric statistics (``None`` when it recorded no ``stats``).

        The entry's own ``stats`` object is returned when every value is a
        number, which is the rule; a statistic of an unknown key (a newer
        minor version) that is not a number is left out.
        """
        shape = entry[fmt.SHAPE]
        # "torch.Size([" plus 18 characters cannot hold 64 dimensions or a dimension of 19 digits: the common case
        if len(shape) > 30:
            dims = _DIM.findall(shape)
            if len(dims) > _MAX_DIMS or any(len(d) > 18 for d in dims):
                raise self.fail(_named(node), f"tensor shape {shape!r:.60} is not a plausible shape")
        stats = entry.get(fmt.STATS)
        if stats is None:
            return None
        if type(stats) is not dict:
            raise self.fail(_named(node), f"tensor 'stats' is {type(stats).__name__}; expected an object of numbers")
        numeric = self._check_stats(stats, node)
        return stats if numeric else {k: v for k, v in stats.items() if type(v) in (int, float)}

    def _check_stats(self, stats: dict[str, Any], node: Node) -> bool:
        """Raise for a statistic of the wrong type or range; False when an unknown key holds a non-number."""
        numeric = True
        for key, number in stats.items():
            kind = type(number)
            if kind is float:
                if key in _COUNTS:
                    raise self.fail(_named(node), f"tensor statistic {key!r} is {number!r:.40}; expected a count")
            elif kind is int:
                if not (0 if key in _COUNTS else -_INT64) <= number < _INT64:
                    raise self.fail(_named(node), f"tensor statistic {key!r} is {number!r:.40}; expected "
                                           f"{'a count' if key in _COUNTS else 'a number'}")
            elif key in _STATS:
                raise self.fail(_named(node), f"tensor statistic {key!r:.40} is {number!r:.40}; expected "
                                       f"{'a count' if key in _COUNTS else 'a number'}")
            else:  # an unknown key is a statistic of a newer minor version: ignored by readers
                numeric = False
        return numeric


def _named(node: Node) -> str:
    """How messages name the call whose tensor entry is wrong (built only when one is)."""
    return node.module_path if node.phase == "forward" else f"backward entry ({node.module_path})"


def check_graph_order(roots: list[Node], json_path: Path) -> None:
    """Refuse graph nodes listed in an order that did not run: one that reads the output of a node after it.

    A graph runtime records its nodes in the order they ran, and a node's input is the very entry (the
    payload) of its producer's output; an input that only a later node produces means the list was
    reordered, and pairing by position would be built on it.
    """
    for root in roots:
        graph = [child for child in root.children if child.graph]
        later: dict[str, str] = {}
        for child in graph:
            for record in child.outputs():
                if record.payload:
                    later.setdefault(record.payload, child.module_path)
        done: set[str] = set()
        for child in graph:
            own = {record.payload for record in child.outputs() if record.payload}
            for record in child.inputs():
                payload = record.payload
                if payload and payload not in done and payload not in own and payload in later:
                    raise TraceFormatError(
                        f"{json_path}: {child.module_path}: reads {later[payload]}'s output, which comes after it "
                        "in the graph's order; graph nodes are listed in the order they ran")
            done |= own
