"""Packages whose modules register what they declare (cache policies, generation procedures).

Such a package's ``__init__`` calls ``import_submodules(__name__, __path__)``: every module
of its folder is imported, in name order, so a new module registers itself and needs no
import line anywhere. ``sinkscope.pipeline.codedigest`` reads that call as an import of
every module of the folder (``submodule_names``), so the code digests cover them too.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable


def submodule_names(package: str, path: Iterable[str]) -> list[str]:
    """The full names of the modules and subpackages of ``package`` found in ``path`` (its
    ``__path__``: one folder or more), in name order; nothing is imported."""
    return sorted({f"{package}.{module.name}" for module in pkgutil.iter_modules([str(p) for p in path])})


def import_submodules(package: str, path: Iterable[str]) -> list[str]:
    """Import every module of ``package`` (``submodule_names``), in name order; their names."""
    names = submodule_names(package, path)
    for name in names:
        importlib.import_module(name)
    return names
