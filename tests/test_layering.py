"""The layers of posenc and the imports allowed between them (DESIGN.md, "Layers of the
package": arrows point down), and no import cycle between modules.

The rule is data, :data:`LAYERS`, one line per layer (docs/design.md copies it): which modules
are the layer and which layers (or single modules) it may import; a module may always import
its own layer. Stated by DESIGN.md: encodings import only kernels and validation; attention
imports the encodings' protocol only (``posenc.encodings.base``); the hf config module imports
encodings; integrations import attention and the hf config module; nothing in the library
imports the lab; in the lab the CLI is on top and nothing imports it. Below all of them the
ground floor: errors, validation and the mask rules (``posenc.mask_rules``).

Every module's imports are read from its source with ast, top level and inside functions
alike (a lazy import is still a dependency), relative imports resolved.
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

#: The layers, bottom to top: (layer, its modules, what it may import). A module pattern
#: ``x.*`` is the module or package ``x`` and everything under it, a plain name that module
#: alone; a module belongs to the layer of its longest matching pattern. "May import" names
#: layers, or single modules of a layer (the attention sees the encodings' protocol only).
LIBRARY = ("ground", "kernels", "encodings", "attention", "masks", "plan", "hf_config", "rope_face", "integrations",
           "moved", "face")
LAYERS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("ground", ("posenc.errors", "posenc._validation", "posenc.mask_rules", "posenc.position_maps", "posenc._version"), ()),
    ("kernels", ("posenc.kernels.*",), ("ground",)),
    ("encodings", ("posenc.encodings.*",), ("ground", "kernels")),
    ("attention", ("posenc.attention.*",), ("ground", "posenc.encodings.base")),
    ("masks", ("posenc.sequences", "posenc.masks"), ("ground",)),
    ("plan", ("posenc.plan",), ("ground", "kernels", "encodings")),
    ("hf_config", ("posenc.hf_config.*",), ("ground", "kernels", "encodings", "plan")),
    ("rope_face", ("posenc.rope",), ("ground", "kernels", "encodings", "hf_config")),
    ("integrations", ("posenc.integrations.*",), ("ground", "kernels", "encodings", "attention", "plan", "hf_config",
                                                  "rope_face")),
    ("moved", ("posenc._moved",), ()),  # names the lab's modules as strings only, imports none
    ("face", ("posenc",), ("ground", "kernels", "encodings", "attention", "masks", "plan", "hf_config", "rope_face",
                           "moved")),
    ("lab", ("posenc.lab.*",), LIBRARY),
    ("cli", ("posenc.lab.cli",), LIBRARY + ("lab",)),
)

#: Imports against :data:`LAYERS`, tolerated until their owners remove them: (importer,
#: imported) -> why, and who. The test fails when one is gone, so that the list stays true.
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {
    ("posenc.rope", "posenc.lab.plots"): "plot_rope_inspection, the lab's figure, loaded on first use by the rope "
                                         "face: the figure's entry point belongs in the lab (issue 20's rope face)",
    ("posenc.encodings.rope.rotary", "posenc.hf_config.rope"): "RoPE.to_hf_dict(), a documented method (README), "
                                                               "delegates at call time to the config writer",
    ("posenc.encodings.irope", "posenc.hf_config.llama4"): "IRoPE.from_hf_config(), a documented constructor "
                                                           "(docs/encodings.md), delegates at call time to the config "
                                                           "reader (Llama 4's defaults, shared with its family record)",
}

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


def layer_of(module: str, layers=LAYERS) -> str | None:
    """The layer whose longest module pattern matches ``module`` (None: in no layer)."""
    best, best_length = None, -1
    for name, patterns, _ in layers:
        for pattern in patterns:
            stem = pattern.removesuffix(".*")
            if module == stem or (pattern.endswith(".*") and module.startswith(stem + ".")):
                if len(stem) > best_length:
                    best, best_length = name, len(stem)
    return best


def violations(graph: dict[str, set[str]], layers=LAYERS) -> list[tuple[str, str, str]]:
    """Every import that :data:`LAYERS` does not allow: (importer, imported, why), sorted; and
    (module, "", why) for a module in no layer."""
    allowed = {name: set(may) for name, _, may in layers}
    found = []
    for importer in sorted(graph):
        own = layer_of(importer, layers)
        if own is None:
            found.append((importer, "", "in no layer of LAYERS: add it to one"))
            continue
        for imported in sorted(graph[importer]):
            theirs = layer_of(imported, layers)
            if theirs == own or theirs in allowed[own] or imported in allowed[own]:
                continue
            found.append((importer, imported, f"{own} may import {sorted(allowed[own]) or 'nothing'} "
                                              f"(and itself), not {theirs}"))
    return found


def test_every_module_is_in_a_layer_and_imports_only_what_its_layer_may():
    found = violations(import_graph())
    unexpected = [v for v in found if v[:2] not in KNOWN_VIOLATIONS]
    assert not unexpected, "imports against the layers (DESIGN.md):\n" + "\n".join(
        f"  {importer} -> {imported}: {why}" for importer, imported, why in unexpected)
    fixed = [pair for pair in KNOWN_VIOLATIONS if pair not in {v[:2] for v in found}]
    assert not fixed, f"these imports are gone: remove them from KNOWN_VIOLATIONS: {fixed}"


def test_the_layers_are_well_formed():
    names = [name for name, _, _ in LAYERS]
    assert len(set(names)) == len(names)
    for name, _, may in LAYERS:
        for target in may:
            assert target in names or layer_of(target) is not None, f"{name} may import {target!r}: not a layer or module"
    assert "lab" not in LIBRARY and "cli" not in LIBRARY
    # nothing in the library may import the lab, and nothing but the CLI's own layer may import the CLI
    for name, _, may in LAYERS:
        if name in LIBRARY:
            assert not {"lab", "cli"} & set(may), f"{name} (library) may import the lab"
        if name != "cli":
            assert "cli" not in may, f"{name} may import the CLI"


def test_the_checker_catches_a_wrong_import():
    """A synthetic module graph against the real table: each wrong arrow is reported, the
    right ones are not."""
    graph = {
        "posenc.encodings.alibi": {"posenc.kernels.rotary_torch", "posenc.errors", "posenc.attention.eager"},
        "posenc.attention.eager": {"posenc.encodings.base", "posenc.encodings.alibi"},
        "posenc.mask_rules": {"posenc.encodings.base"},
        "posenc.hf_config.rope": {"posenc.encodings.rope.scaling"},
        "posenc.integrations.transformers": {"posenc.hf_config", "posenc.attention"},
        "posenc.masks": {"posenc.sequences", "posenc.attention.masks"},
        "posenc.lab.model": {"posenc.attention", "posenc.lab.cli"},
        "posenc.lab.cli": {"posenc.lab.model", "posenc.integrations.transformers"},
        "posenc.rope": {"posenc.lab.plots"},
        "posenc": {"posenc.integrations"},
        "posenc.newcomer": set(),
    }
    assert {(importer, imported) for importer, imported, _ in violations(graph)} == {
        ("posenc.encodings.alibi", "posenc.attention.eager"),  # encodings import only kernels and ground
        ("posenc.attention.eager", "posenc.encodings.alibi"),  # attention sees the protocol only
        ("posenc.mask_rules", "posenc.encodings.base"),  # the ground floor imports nothing of posenc
        ("posenc.masks", "posenc.attention.masks"),
        ("posenc.lab.model", "posenc.lab.cli"),  # nothing imports the CLI
        ("posenc.rope", "posenc.lab.plots"),  # the library never imports the lab
        ("posenc", "posenc.integrations"),
        ("posenc.newcomer", ""),  # a module in no layer
    }
    assert layer_of("posenc.hf_config") == layer_of("posenc.hf_config.rope") == "hf_config"  # whether or not it exists
    assert layer_of("posenc.lab.cli") == "cli" and layer_of("posenc.lab.experiments.runs") == "lab"
    assert layer_of("posenc.encodings.base") == "encodings" and layer_of("posenc.sequences") == "masks"


def test_docs_design_states_the_same_layers():
    """docs/design.md's layer table is LAYERS, row for row (so the page cannot drift)."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text()
    section = text[text.index("| layer | modules | may import |"):]
    rows = re.findall(r"^\| (\w+) \| (.+?) \| (.+?) \|$", section.split("\n\n")[0], re.M)[1:]  # past the header
    documented = [(name, tuple(re.findall(r"`([^`]+)`", mods)), tuple(re.findall(r"`([^`]+)`", may)))
                  for name, mods, may in rows]
    assert documented == [(name, tuple(mods), tuple(may)) for name, mods, may in LAYERS]
