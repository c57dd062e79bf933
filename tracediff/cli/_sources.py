"""Taking another tool's dump where a command takes a trace (``align``, ``plot``, ``show``)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..importers import Opened


@contextmanager
def dumps_as_traces(args: argparse.Namespace, command: str, names: tuple[str, ...]) -> Iterator[dict[str, Opened]]:
    """Replace each trace argument in ``names`` that is a recognised dump by a trace imported from it.

    The imported traces live in temporary folders until the block ends; each
    import is said on stderr in one line. A folder that is neither a trace
    nor a dump keeps the trace reader's error. What is yielded names the arguments that were looked at
    as possible dumps; a trace folder is not among them.
    """
    from ..trace.load import is_trace_folder

    with ExitStack() as stack:
        found: dict[str, Opened] = {}
        for name in names:
            given = getattr(args, name, None)
            if given is None or is_trace_folder(given):  # the importers (and their imports) are not needed
                continue
            from ..importers import opened

            source = stack.enter_context(opened(given))
            found[name] = source
            result = source.imported
            if result is not None:
                print(f"tracediff {command}: {given}: read as a dump of kind {result.kind} (as `tracediff import "
                      f"{result.kind}` would): {result.calls} calls, {result.tensors} tensors", file=sys.stderr)
                setattr(args, name, source.trace)
        yield found


def given_paths(result: Any, found: dict[str, Opened]) -> Any:
    """``result`` (an ``Alignment``) naming the dumps the user gave rather than the temporary traces."""
    changes = {f"trace_{side}": found[side].given for side in ("a", "b")
               if side in found and found[side].imported is not None}
    if "baseline" in found and found["baseline"].imported is not None:
        changes["baseline"] = found["baseline"].given
    return dataclasses.replace(result, **changes) if changes else result
