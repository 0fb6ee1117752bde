"""Import paths that moved, kept working: ``import posenc.model`` is ``posenc.lab.model``.

Modules moved when the laboratory (the LM, its training, the experiments, figures, benchmarks
and the CLI) left the library's root for :mod:`posenc.lab`. Each old name (and any submodule
under it) is an alias of the module itself, not a copy, so classes keep one identity and
``python -m posenc.cli`` still runs the CLI. Importing an old path imports the lab, which the
library itself never does.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType

#: old module path -> new module path (submodules follow their package).
MOVED: dict[str, str] = {
    f"posenc.{name}": f"posenc.lab.{name}"
    for name in ("model", "generation", "checkpoint", "data", "train", "evaluate", "experiments", "bench", "plots", "cli")
}


def new_name(fullname: str) -> str | None:
    """The module's path today, or None when ``fullname`` did not move."""
    for old, new in MOVED.items():
        if fullname == old or fullname.startswith(old + "."):
            return new + fullname[len(old):]
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The target ran when it was imported. The import system has just set the module's
        # __spec__ to the alias's (it does so whatever the loader returns): give it back its
        # own, so that find_spec, reload and pickling see the module where it lives.
        module.__spec__ = self._spec

    def get_code(self, fullname: str) -> CodeType | None:
        # for ``python -m posenc.cli``: runpy runs the target's code as __main__
        spec = importlib.util.find_spec(self.target)
        return spec.loader.get_code(self.target) if spec is not None else None


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 (importlib's signature)
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once): it claims only the moved names, and it
    must claim their submodules before the path finder would load a second copy of them."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())
