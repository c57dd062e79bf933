"""Hostile variants of genuine graph and compiled traces, each one edit a tester could make to trace B.

``variants(kind)`` lists them by name for a genuine trace of ``KINDS[kind]``: a llama.cpp trace (graph nodes,
tests/ports/llama_cpp_harness.py) or a ``torch.compile`` capture (aot_eager, tests/capturing/test_compiled.py).
Each edits a copy of the genuine trace in place and says whether the edit corrupts a value compared or removes
structure A has (``must_fail``: such a trace never passes), or leaves what is compared intact (any verdict;
still no traceback, and exit 2 is one line). They are:

* ``payload:<kind>:<node>``: a node's output payload scaled x10, replaced by random values, by the same node's
  of the other block, negated or zeroed;
* ``edit:<what>``: one JSON edit of the node of a real divergence (its output x2, which alone exits 1): its
  ``module_type`` changed, an ``op`` key added, its shape string changed, its ``outputs`` removed, the root's
  ``step`` removed, the root's children reversed, the node renamed into block 1, block 1 deleted;
* ``clean:<what>``: the edits that remove what A has, on the clean trace;
* ``scope:<what>``: a scope numbered with 4,301 digits (one node, or a whole block), steps that are negative,
  huge, a string, or another number.

Run as a script to make the genuine traces (``genuine``) and print each variant's exit code and verdict,
with the counts of docs/safety.md::

    python -m tests.safety.trace_variants llama.cpp compiled
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Tree = dict[str, Any]
HUGE = "9" * 4301  # over Python's 4,300-digit limit for int()


@dataclass(frozen=True)
class Kind:
    """Where a genuine trace of one kind has what the variants edit."""

    divergent: str  # its output x2 on its own: a real divergence (exit 1)
    payload_nodes: tuple[str, ...]
    block: str  # the numbered block that is deleted or renamed: ``{prefix}.1``
    other_block: tuple[str, str]  # (this block's scope, the other's), for another block's payload


KINDS = {
    "llama.cpp": Kind("Llama.blk.0.ffn_gate", ("Llama.blk.0.attn_out", "Llama.blk.0.Vcur", "Llama.blk.1.ffn_out",
                                               "Llama.blk.0.ffn_up", "Llama.blk.1.Qcur"),
                      "Llama.blk.1", ("blk.0.", "blk.1.")),
    "compiled": Kind("Tiny.layers.0.fc1", ("Tiny.layers.0.fc2", "Tiny.layers.1.fc1", "Tiny.layers.0.norm"),
                     "Tiny.layers.1", ("layers.0.", "layers.1.")),
}
PAYLOAD_KINDS = ("x10", "random", "other_block", "negated", "zeros")


@dataclass(frozen=True)
class Variant:
    name: str
    must_fail: bool  # corrupts a compared value or removes structure: the verdict is never passed
    edit: Callable[[Path], None]  # edits a copy of trace B in place


def tree_file(folder: Path) -> Path:
    return next(folder.glob("*_debug_tree_FULL_TENSORS.json"))


def _edit_tree(folder: Path, edit: Callable[[Tree], None]) -> None:
    path = tree_file(folder)
    tree = json.loads(path.read_text())
    edit(tree)
    path.write_text(json.dumps(tree))
    for summary in folder.glob("*_debug_tree_SUMMARY.json"):  # a tester edits the one file read
        summary.unlink()


def _nodes(tree: Tree) -> Iterator[Tree]:
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.get("children", []))


def _node(tree: Tree, path: str) -> Tree:
    return next(n for n in _nodes(tree) if n["module_path"] == path and n.get("call_index", 0) == 0)


def _payload(folder: Path, path: str) -> Path:
    return folder / f"{path}_outputs.safetensors"


def _rewrite_payload(folder: Path, path: str, change: Callable[[np.ndarray, Path], np.ndarray]) -> None:
    """``path``'s output changed, and so every payload file holding the same tensor (its consumer's input).

    A graph node's consumer reads the very entry of its output (one file); a module trace records the tensor
    again as the next call's input: changing one copy only is a trace where B's code changed the value
    between the calls, which the verdict may rightly call a cut at another point (docs/verdicts.md).
    """
    from safetensors.numpy import load_file, save_file

    original = next(iter(load_file(str(_payload(folder, path))).values()))
    changed = np.ascontiguousarray(change(original, folder)).astype(original.dtype)
    for file in sorted(folder.glob("*.safetensors")):
        tensors = load_file(str(file))
        if len(tensors) == 1 and np.array_equal(next(iter(tensors.values())), original):
            save_file({next(iter(tensors)): changed}, str(file))


def _payload_variant(kind: Kind, change: str, path: str) -> Variant:
    this, that = kind.other_block
    other = path.replace(this, that) if this in path else path.replace(that, this)

    def from_other(value: np.ndarray, folder: Path) -> np.ndarray:
        from safetensors.numpy import load_file

        return next(iter(load_file(str(_payload(folder, other))).values())).reshape(value.shape)

    changes: dict[str, Callable[[np.ndarray, Path], np.ndarray]] = {
        "x10": lambda v, _: v * 10, "negated": lambda v, _: -v, "zeros": lambda v, _: np.zeros_like(v),
        "random": lambda v, _: np.random.default_rng(0).standard_normal(v.shape) * (v.std() + 1),
        "other_block": from_other}
    return Variant(f"payload:{change}:{path}", True, lambda b: _rewrite_payload(b, path, changes[change]))


def _structure_edits(kind: Kind) -> dict[str, Callable[[Tree], None]]:
    def on_node(change: Callable[[Tree], None]) -> Callable[[Tree], None]:
        return lambda tree: change(_node(tree, kind.divergent))

    def shape(node: Tree) -> None:
        node["outputs"]["shape"] = "torch.Size([1, 3, 128])"

    def rename(tree: Tree) -> None:
        node = _node(tree, kind.divergent)
        node["module_path"] = kind.block + "." + node["module_path"].rsplit(".", 1)[1] + "_moved"

    def delete_block(tree: Tree) -> None:
        for node in _nodes(tree):
            if "children" in node:
                node["children"] = [c for c in node["children"] if c["module_path"] != kind.block
                                    and not c["module_path"].startswith(kind.block + ".")]

    def reverse(tree: Tree) -> None:
        tree["children"].reverse()

    return {
        "module_type": on_node(lambda n: n.update(module_type="Add")),
        "op_key": on_node(lambda n: n.update(op="aten.mm")),
        "shape_string": on_node(shape),
        "outputs_removed": on_node(lambda n: n.pop("outputs", None)),
        "root_step_removed": lambda tree: tree.pop("step", None),
        "children_reversed": reverse,
        "renamed_into_block_1": rename,
        "block_1_deleted": delete_block,
    }


REMOVING = ("outputs_removed", "block_1_deleted")  # never a pass, even on the clean trace


def _scope_edits(kind: Kind) -> dict[str, tuple[bool, Callable[[Tree], None]]]:
    prefix = kind.block.rsplit(".", 1)[0] + "."

    def huge_node(tree: Tree) -> None:
        node = _node(tree, kind.payload_nodes[2])
        node["module_path"] = prefix + HUGE + node["module_path"][len(kind.block):]

    def huge_block(tree: Tree) -> None:  # the whole block renamed: A's block 1 has no counterpart left
        for node in _nodes(tree):
            if node["module_path"] == kind.block or node["module_path"].startswith(kind.block + "."):
                node["module_path"] = prefix + HUGE + node["module_path"][len(kind.block):]

    def step(value: Any) -> Callable[[Tree], None]:
        return lambda tree: tree.update(step=value)

    return {"huge_node": (False, huge_node), "huge_block": (True, huge_block), "step_negative": (False, step(-1)),
            "step_huge": (False, step(10 ** 30)), "step_string": (False, step("0")), "step_other": (False, step(3))}


def variants(kind_name: str) -> list[Variant]:
    kind = KINDS[kind_name]
    found = [_payload_variant(kind, change, path) for path in kind.payload_nodes for change in PAYLOAD_KINDS]
    edits = _structure_edits(kind)

    def with_divergence(edit: Callable[[Tree], None]) -> Callable[[Path], None]:
        def apply(b: Path) -> None:
            _rewrite_payload(b, kind.divergent, lambda v, _: v * 2)
            _edit_tree(b, edit)
        return apply

    found += [Variant(f"edit:{what}", True, with_divergence(edit)) for what, edit in edits.items()]
    found += [Variant(f"clean:{what}", True, lambda b, edit=edits[what]: _edit_tree(b, edit)) for what in REMOVING]
    found += [Variant(f"scope:{what}", must_fail, lambda b, edit=edit: _edit_tree(b, edit))
              for what, (must_fail, edit) in _scope_edits(kind).items()]
    return found


def make(variant: Variant, genuine: Path, out: Path) -> Path:
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(genuine, out)
    variant.edit(out)
    return out


def genuine(kind: str, root: Path) -> tuple[Path, Path]:
    """The genuine pair of ``kind`` made into ``root``: (A, B), B clean and passing against A."""
    if kind == "llama.cpp":  # transformers' Llama against llama.cpp running its own F32 conversion
        from tests.ports.llama_cpp_harness import FAMILIES, GgufRun

        run = GgufRun(FAMILIES["llama"], root)
        return run.trace("reference"), run.trace("clean")
    import torch

    from tests.capturing.test_compiled import capture, tiny, tokens

    torch._dynamo.reset()  # compiled from nothing: the capture sees the whole compilation
    capture(tiny(), root / "eager", tokens())
    capture(torch.compile(tiny(), backend="aot_eager", dynamic=False), root / "compiled", tokens())
    torch._dynamo.reset()
    return root / "eager", root / "compiled"


def main(kinds: list[str]) -> None:  # pragma: no cover - by hand: the counts of docs/safety.md
    import contextlib
    import io
    import tempfile
    from collections import Counter

    from tracediff.cli.main import main as cli

    for kind in kinds or list(KINDS):
        tally: Counter[str] = Counter()
        with tempfile.TemporaryDirectory() as scratch:
            a, b = genuine(kind, Path(scratch) / "genuine")
            for variant in variants(kind):
                folder = make(variant, b, Path(scratch) / "b")
                out, err = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    code = cli(["align", str(a), str(folder), "--format", "json"])
                verdict = json.loads(out.getvalue())["verdict"] if code in (0, 1) else err.getvalue().strip()[-90:]
                tally[f"exit {code}" + (" (must fail)" if variant.must_fail else "")] += 1
                print(f"{kind:9} {variant.name:45} {'must fail' if variant.must_fail else '':9} exit {code} {verdict}")
        print(f"{kind}: {len(variants(kind))} variants: {dict(sorted(tally.items()))}")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
