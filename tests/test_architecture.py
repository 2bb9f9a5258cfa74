"""The package's layers (docs/architecture.md): a module imports only from a lower layer
or from its own part of the package, and the planning code imports no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sinkscope.pipeline.codedigest import ROOT, _imports

# Lowest first. A base module may import other base modules; a subpackage's modules may
# import each other; anything else only from a lower layer.
LAYERS = (
    ("sinkscope", "sinkscope.arguments", "sinkscope.errors", "sinkscope.io", "sinkscope.labels", "sinkscope.manifests", "sinkscope.naming", "sinkscope.options",
     "sinkscope.schema", "sinkscope.tables", "sinkscope.digests", "sinkscope.tokens", "sinkscope.attention"),
    ("sinkscope.model", "sinkscope.stats"),
    ("sinkscope.generation",),
    ("sinkscope.legacy", "sinkscope.demo", "sinkscope.figures"),
    ("sinkscope.plot",),
    ("sinkscope.pipeline",),
    ("sinkscope.cli", "sinkscope.train"),
)
BASE = LAYERS[0]


def _part(module: str) -> str:
    """The part of the package a module belongs to (a base module, or a subpackage)."""
    for layer in LAYERS:
        for part in sorted(layer, key=len, reverse=True):
            if module == part or (part != "sinkscope" and module.startswith(part + ".")):
                return part
    raise AssertionError(f"{module} is in no layer of tests/test_architecture.py: add it")


def _layer(part: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if part in layer)


def _modules() -> list[str]:
    names = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_module_imports_only_from_its_part_or_a_lower_layer():
    wrong = []
    for module in _modules():
        part = _part(module)
        for imported in _imports(module, True):
            target = _part(imported)
            same_part = target == part or (part in BASE and target in BASE)
            if not same_part and _layer(target) >= _layer(part):
                wrong.append(f"{module} imports {imported}")
    assert not wrong, "layering broken:\n  " + "\n  ".join(wrong)


PLANNING = (
    "sinkscope.pipeline.study",
    "sinkscope.pipeline.config",
    "sinkscope.pipeline.resources",
    "sinkscope.pipeline.codedigest",
    "sinkscope.pipeline.invocation",
    "sinkscope.pipeline.integrity",
    "sinkscope.figures.registry",
    "sinkscope.model.checkpoints",
    "sinkscope.model.lora",
    "sinkscope.options",
    "sinkscope.naming",
    "sinkscope.schema",
)


@pytest.mark.parametrize("heavy", ["torch", "matplotlib", "pandas"])
def test_planning_code_imports_no_heavy_library(heavy):
    code = "import sys\n" + "".join(f"import {m}\n" for m in PLANNING) + f"assert {heavy!r} not in sys.modules, {heavy!r}\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(ROOT).parent)
    assert result.returncode == 0, result.stderr[-2000:]
