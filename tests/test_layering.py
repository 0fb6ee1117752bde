"""No import cycles between posenc's modules (DESIGN.md: arrows point down the layer list).

Every module's imports are read from its source with ast, top level and inside functions
alike (a lazy import that closes a circle is still a circle), relative imports resolved.
``from package import name`` counts as an import of the submodule when ``name`` is one, and
of the package otherwise. A package's ``__init__`` is not counted as imported by its
submodules' importers: Python runs it first, but it is the re-exporting face of the layer
below, not a dependency of the code that reaches past it.
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
from pathlib import Path

import posenc

#: Known cycles, tolerated until their owners remove them: the sorted module names of one
#: strongly connected component -> who is fixing it. Empty: posenc has none.
EXPECTED_CYCLES: dict[tuple[str, ...], str] = {}


def posenc_modules() -> dict[str, Path]:
    """Every module of the package, by dotted name, with its source file."""
    modules = {"posenc": Path(posenc.__file__)}
    for info in pkgutil.walk_packages(posenc.__path__, prefix="posenc."):
        spec = importlib.util.find_spec(info.name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            modules[info.name] = Path(spec.origin)
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The posenc modules that ``name`` (source at ``path``) imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else stem for alias in node.names]
        else:
            continue
        for target in targets:
            # `import posenc.a.b` names the deepest module that exists
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = posenc_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_relative_and_lazy_imports():
    graph = import_graph()
    assert "posenc.lab.experiments.extrapolation" in graph["posenc.lab.cli"]  # imported inside a function
    assert "posenc.lab.experiments.distributed" in graph["posenc.lab.experiments.runs"]  # `from . import distributed`
    assert "posenc.lab.checkpoint" in graph["posenc.lab.experiments.runs"]  # `from ..checkpoint import ...`


def test_no_import_cycle_between_posenc_modules():
    found = cycles(import_graph())
    unexpected = [c for c in found if c not in EXPECTED_CYCLES]
    assert not unexpected, f"import cycles between posenc modules: {unexpected}"
    fixed = [c for c in EXPECTED_CYCLES if c not in found]
    assert not fixed, f"these cycles are gone: remove them from EXPECTED_CYCLES: {fixed}"
