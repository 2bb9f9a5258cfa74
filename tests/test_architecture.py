"""The package's layers (docs/architecture.md): a module imports only from a lower layer
or from its own part of the package, and the planning code imports no torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from graphlib import CycleError, TopologicalSorter
from itertools import zip_longest
from pathlib import Path

import pytest

from sinkscope.pipeline.codedigest import ROOT, _imports, _module_file

# The one list of the package's layers, lowest first: (parts, what they hold). A base
# module may import other base modules; a subpackage's modules may import each other;
# anything else only from a lower layer. docs/architecture.md and the package's docstring
# show this list as drawn by ``layer_diagram`` (checked below; ``python
# tests/test_architecture.py`` prints the diagram).
LAYER_TABLE = (
    (
        (
            "errors",
            "arguments",
            "io",
            "manifests",
            "naming",
            "names",
            "options",
            "schema",
            "schemafile",
            "discovery",
            "tables",
            "digests",
            "tokens",
            "attention",
            "labels",
            "interventions",
            "prompt_schedules",
            "sweeps",
        ),
        "leaves shared by everything",
    ),
    (
        ("model", "stats"),
        "Wan2.1, KV cache, cache policies, checkpoints, loading; per-call statistics and derived summaries",
    ),
    (("generation",), "the KV-cache generation procedures and the capture of their attention"),
    (
        ("legacy", "demo", "figures"),
        "old .pt caches; the demo model's data and training; every figure and the summary page",
    ),
    (("plot",), "one-line plotting from a table"),
    (("pipeline",), "config check, study plan, digests, integrity, recovery, jobs"),
    (("cli",), "the `sinkscope` command"),
)
LAYERS = tuple(tuple(f"sinkscope.{part}" for part in parts) for parts, _ in LAYER_TABLE)
LAYERS = (("sinkscope", *LAYERS[0]), *LAYERS[1:])  # the package's __init__ is a base module
BASE = LAYERS[0]


def _part(module: str) -> str:
    """The part of the package a module belongs to (a base module, or a subpackage)."""
    for layer in LAYERS:
        for part in sorted(layer, key=len, reverse=True):
            if module == part or (part != "sinkscope" and module.startswith(part + ".")):
                return part
    raise AssertionError(f"{module} is in no layer: add it to LAYER_TABLE in tests/test_architecture.py")


def _layer(part: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if part in layer)


def _modules() -> list[str]:
    names = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def layer_diagram() -> str:
    """``LAYER_TABLE`` drawn highest layer first: number, parts, what they hold."""
    lines = []
    for number, (parts, holds) in reversed(list(enumerate(LAYER_TABLE))):
        names = textwrap.wrap(" ".join(parts), 27, break_on_hyphens=False)
        for i, (name, text) in enumerate(
            zip_longest(names, textwrap.wrap(holds, 60, break_on_hyphens=False), fillvalue="")
        ):
            lines.append(f"  {number if i == 0 else ' '}  {name:<28} {text}".rstrip())
    return "\n".join(lines)


def test_the_docs_and_the_package_show_this_layer_list():
    import sinkscope

    diagram = layer_diagram()
    architecture = (ROOT.parents[1] / "docs" / "architecture.md").read_text()
    assert f"```\n{diagram}\n```" in architecture, f"docs/architecture.md's layers should read:\n{diagram}"
    assert diagram in sinkscope.__doc__, f"sinkscope's docstring should show the layers:\n{diagram}"


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


def imports_with_type_hints(module: str) -> set[str]:
    """The package modules ``module`` imports anywhere in its source, ``if TYPE_CHECKING:``
    blocks included (a cycle through type hints is still two modules that need each other)."""
    path = _module_file(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            named = {f"{base}.{alias.name}" for alias in node.names}
            found.update(named if all(_module_file(name) for name in named) else {base, *named})
    return {name for name in found if name.startswith("sinkscope") and _module_file(name) and name != module}


def test_no_import_cycle():
    """No module imports, directly or through others, a module that imports it: imports
    inside functions and under ``if TYPE_CHECKING:`` count (a cycle through type hints is
    still two modules that need each other)."""
    graph = {module: imports_with_type_hints(module) for module in _modules()}
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as error:
        cycle = error.args[1][::-1]  # graphlib names each module after one it imports
        raise AssertionError("import cycle: " + " imports ".join(cycle)) from None


def snakefile_imports() -> set[str]:
    """The package modules the Snakefile and its rule files import at their top level."""
    root = ROOT.parents[1]
    text = "\n".join(path.read_text() for path in [root / "Snakefile", *sorted((root / "rules").glob("*.smk"))])
    return set(re.findall(r"^(?:from|import) (sinkscope[\w.]*)", text, re.MULTILINE))


# The planning code: what the Snakefile imports while it parses, and the modules those
# import on demand when they check a config (checkpoints and their adapters opened
# without torch, the memory estimate, the code digests, the options and the schema).
PLANNING = tuple(
    sorted(
        snakefile_imports()
        | {
            "sinkscope.model.checkpoints",
            "sinkscope.model.formats",
            "sinkscope.model.weightfiles",
            "sinkscope.model.lora",
            "sinkscope.model.torchfile",
            "sinkscope.pipeline.resources",
            "sinkscope.pipeline.codedigest",
            "sinkscope.pipeline.grid",
            "sinkscope.pipeline.extractplan",
            "sinkscope.pipeline.effectsplan",
            "sinkscope.pipeline.figureplan",
            "sinkscope.options",
            "sinkscope.schema",
            "sinkscope.schemafile",
            "sinkscope.discovery",
            "sinkscope.interventions",
            "sinkscope.prompt_schedules",
            "sinkscope.sweeps",
        }
    )
)


def test_the_docs_name_every_planning_module():
    assert "sinkscope.pipeline.recovery" in PLANNING and "sinkscope.pipeline.study" in PLANNING
    architecture = (ROOT.parents[1] / "docs" / "architecture.md").read_text()
    paragraph = next(
        part for part in architecture.split("\n\n") if "imports neither torch, matplotlib nor pandas" in part
    )
    named = set(re.findall(r"`([\w.]+)`", paragraph))
    missing = [module for module in PLANNING if module.removeprefix("sinkscope.") not in named]
    assert not missing, f"docs/architecture.md's planning code misses {', '.join(missing)}"


@pytest.mark.parametrize("heavy", ["torch", "matplotlib", "pandas"])
def test_planning_code_imports_no_heavy_library(heavy):
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in PLANNING)
        + f"assert {heavy!r} not in sys.modules, {heavy!r}\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(ROOT).parent)
    assert result.returncode == 0, result.stderr[-2000:]


if __name__ == "__main__":
    print(layer_diagram())
