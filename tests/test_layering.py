"""The package's layers, read from the import statements of every module (module level and inside functions).

The folders draw the pipeline, and imports only go down it: cli -> demo -> render -> replaying / steps / show
-> alignment -> sharding / compare / maps -> capturing / importers -> trace -> files -> native (the C build
both the capture and the comparison use) -> the base (``format``, ``errors``, ``display``, ``_version``,
``order``). The core never imports the command line or a renderer:
``Alignment.to_html()`` reaches the renderer through the registry in ``tracediff.display``, which the render
package fills. Inside
``alignment``, pairing (which call and tensor pairs with which) and verdicts (what the measured rows mean)
do not import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tracediff

PACKAGE_ROOT = Path(tracediff.__file__).parent

# Each layer and the layers it may import (besides itself).
_CORE_BELOW_ALIGNMENT = {"base", "native", "files", "trace", "maps", "compare", "sharding"}
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "native": {"base"},
    "files": {"base"},
    "trace": {"base", "files"},
    "capturing": {"base", "native", "files", "trace"},
    "importers": {"base", "files", "trace"},
    "maps": {"base", "files", "trace"},
    "compare": {"base", "native", "files", "trace"},
    "sharding": {"base", "files", "trace"},
    "alignment": _CORE_BELOW_ALIGNMENT,
    "show": {"base", "files", "trace"},
    "steps": {"base", "native", "files", "trace", "capturing", "compare"},
    "replaying": {*_CORE_BELOW_ALIGNMENT, "capturing", "alignment"},
    "attribution": {*_CORE_BELOW_ALIGNMENT, "capturing", "alignment", "replaying"},
    "render": {*_CORE_BELOW_ALIGNMENT, "capturing", "alignment", "show", "steps", "replaying", "attribution"},
    "demo": {*_CORE_BELOW_ALIGNMENT, "capturing", "alignment", "render"},
    "cli": {*_CORE_BELOW_ALIGNMENT, "capturing", "importers", "alignment", "show", "steps", "replaying", "render",
            "demo", "attribution"},
    "entry": {*_CORE_BELOW_ALIGNMENT, "capturing", "importers", "alignment", "show", "steps", "replaying", "cli",
              "attribution"},
}
CORE = {"base", "native", "files", "trace", "capturing", "importers", "maps", "compare", "sharding", "alignment",
        "show", "steps", "replaying", "attribution"}
BASE_MODULES = {"errors", "format", "display", "_version", "order", "globs"}
#: Inside alignment: what each part may import of the others (besides itself).
ALIGNMENT_PARTS: dict[str, set[str]] = {
    "pairing": {"result"},
    "verdicts": {"result", "rows"},
    "rows": {"result"},
    "result": set(),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return "entry"  # tracediff/__init__.py (lazy names) and python -m tracediff
    head = parts[1]
    if head in BASE_MODULES:
        return "base"
    if head in ALLOWED:
        return head
    raise AssertionError(f"{module}: not in any layer; add {head!r} to ALLOWED in {__file__}")


def is_module(name: str) -> bool:
    path = PACKAGE_ROOT.parent / Path(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path) -> set[str]:
    """Every tracediff module that ``path`` imports, resolved (``from .. import format`` -> ``tracediff.format``)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return imports_in(path.read_text(encoding="utf-8"), package)


def imports_in(source: str, package: str) -> set[str]:
    """The tracediff modules imported by ``source``, a module of ``package``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if is_module(sub) else source)
    return {name for name in found if name == "tracediff" or name.startswith("tracediff.")}


MODULES = sorted(PACKAGE_ROOT.rglob("*.py"))


def test_every_module_is_in_a_layer() -> None:
    for path in MODULES:
        layer_of(module_name(path))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_imports_go_down_the_layers_only(path: Path) -> None:
    module = module_name(path)
    layer = layer_of(module)
    wrong = sorted(f"{target} ({layer_of(target)})" for target in imports_of(path)
                   if target != "tracediff" and layer_of(target) != layer
                   and layer_of(target) not in ALLOWED[layer])
    assert not wrong, f"{module} ({layer}) imports upwards: {', '.join(wrong)}"


def test_the_core_never_imports_the_cli_or_a_renderer() -> None:
    for path in MODULES:
        module = module_name(path)
        if layer_of(module) in CORE:
            bad = {t for t in imports_of(path) if t != "tracediff" and layer_of(t) in {"cli", "render", "demo"}}
            assert not bad, f"{module} imports {sorted(bad)}"


def test_the_checker_sees_a_function_level_import() -> None:
    """The old ``to_html`` imported the renderer inside the method; such imports count too."""
    assert "tracediff.render.html" not in imports_of(PACKAGE_ROOT / "alignment" / "result.py")
    old_to_html = "def to_html(self):\n    from ..render.html import render_html\n    return render_html(self)\n"
    assert imports_in(old_to_html, "tracediff.alignment") == {"tracediff.render.html"}
    assert imports_in("from .. import format as fmt\n", "tracediff.trace") == {"tracediff.format"}
    assert layer_of("tracediff.render.html") not in ALLOWED["alignment"]


def test_every_module_imports_under_its_own_name() -> None:
    """``import tracediff.<anything>`` works: no module is shadowed by a public function."""
    import importlib

    optional = {"tracediff.steps.lightning", "tracediff.render.plot"}  # need extras at import time
    for path in MODULES:
        module = module_name(path)
        if module in optional or module.endswith("__main__"):
            continue
        assert importlib.import_module(module).__name__ == module


def _alignment_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "alignment" and parts[2] in ALIGNMENT_PARTS else None


def test_pairing_and_verdicts_do_not_import_each_other() -> None:
    for path in MODULES:
        module = module_name(path)
        part = _alignment_part(module)
        if part is None:
            continue
        wrong = sorted(t for t in imports_of(path)
                       if (other := _alignment_part(t)) not in (None, part) and other not in ALIGNMENT_PARTS[part])
        assert not wrong, f"{module} ({part}) imports {wrong}"


def test_no_private_grab_bag_modules_at_the_top() -> None:
    """Every top-level module belongs to a stage or is one of the base's few named ones."""
    top = {path.stem for path in PACKAGE_ROOT.glob("*.py")} - {"__init__", "__main__"}
    assert top <= BASE_MODULES | {"show"}, sorted(top - BASE_MODULES - {"show"})


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other, directly or through others (Tarjan's strongly connected
    components of the import graph, TYPE_CHECKING and function-level imports included), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(circles)


def test_no_module_imports_itself_through_others() -> None:
    """Imports form no circle at all, inside a layer too (an upward import is only one kind of circle)."""
    graph = {module_name(path): {t for t in imports_of(path) if t != "tracediff"} for path in MODULES}
    circles = import_circles(graph)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(circle) for circle in circles)


def test_the_circle_finder_names_a_circle_inside_a_layer() -> None:
    graph = {"a.result": {"a.steps"}, "a.steps": {"a.rows"}, "a.rows": {"a.result"}, "a.leaf": set(),
             "b.files": {"b.decoded"}, "b.decoded": {"b.files", "a.leaf"}}
    assert import_circles(graph) == [["a.result", "a.rows", "a.steps"], ["b.decoded", "b.files"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []
