"""Digests of the code a pipeline stage runs, for Snakemake's rerun triggers.

The Snakemake rules call thin scripts, so Snakemake's own ``code`` trigger sees none of
the logic. Each rule therefore gets, as a param, the digest of the package modules that
compute its result: the stage's job module and every package module it imports,
transitively (imports inside functions included; found by reading the source, not by
importing it, so this costs no torch import; a package whose ``__init__`` calls
``sinkscope.discovery.import_submodules`` imports every module of its folder). A changed line of the statistics reruns
extraction; a changed figure module reruns that figure only.

Left out, so that editing them reruns nothing: imports under ``if TYPE_CHECKING:``
(never run), and the modules that run a job but compute none of its values
(``NOT_RESULT_CODE``: the planning and validation code, the job wrapper with its logs,
error lines and provenance, the error classes, and package ``__init__`` files that only
route names). ``tests/test_codedigest.py`` pins each stage's modules, so a change of a
closure is a visible change of that test. docs/reruns-and-faults.md says how to force
or skip a rerun.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from functools import cache, lru_cache
from pathlib import Path

from sinkscope.discovery import submodule_names

PACKAGE = "sinkscope"
ROOT = Path(__file__).resolve().parent.parent
# Digests are reused while every source file keeps its size and mtime (a parse of the
# workflow then reads no source at all).
CACHE = ".snakemake/sinkscope/code-digests.json"


def _module_file(name: str) -> Path | None:
    parts = name.split(".")[1:]
    base = ROOT.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _parents(name: str) -> list[str]:
    """Packages whose __init__ runs when ``name`` is imported (sinkscope.a.b -> sinkscope, sinkscope.a)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


# Modules that run a job but compute none of its values: editing them reruns nothing.
NOT_RESULT_CODE = frozenset(
    {
        "sinkscope",  # the version string
        "sinkscope.discovery",  # imports a package's modules (each covered as imported)
        "sinkscope.errors",  # exception classes and their messages
        "sinkscope.names",  # the rule for names the user chooses (validation)
        "sinkscope.pipeline",
        "sinkscope.pipeline.codedigest",
        "sinkscope.pipeline.config",
        "sinkscope.pipeline.effectsplan",
        "sinkscope.pipeline.extractplan",
        "sinkscope.pipeline.figureplan",
        "sinkscope.pipeline.grid",
        "sinkscope.pipeline.invocation",
        "sinkscope.pipeline.jobs",  # logs, one-line errors, device choice (a param), provenance
        "sinkscope.pipeline.layout",
        "sinkscope.pipeline.resources",
        "sinkscope.pipeline.study",
        "sinkscope.pipeline.videoplan",
    }
)


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _skipped_nodes(tree: ast.Module, lazy: bool) -> set[int]:
    """Nodes whose imports never run with the module: ``if TYPE_CHECKING:`` blocks, and
    (``lazy=False``) a package's module-level ``__getattr__``."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    if not lazy:
        skipped |= _lazy_nodes(tree)
    return skipped


def _lazy_nodes(tree: ast.Module) -> set[int]:
    """Nodes inside a module-level ``__getattr__`` (a package's lazy attributes)."""
    lazy: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            lazy.update(id(child) for child in ast.walk(node))
    return lazy


def _discovers(node: ast.AST) -> bool:
    """Whether ``node`` is a call of ``import_submodules`` (``sinkscope.discovery``)."""
    if not isinstance(node, ast.Call):
        return False
    function = node.func
    return (function.id if isinstance(function, ast.Name) else getattr(function, "attr", None)) == "import_submodules"


@cache
def _imports(name: str, lazy: bool = True) -> frozenset[str]:
    """Package modules imported anywhere in module ``name``'s source.

    ``lazy=False`` leaves out the imports of a package's ``__getattr__``: they run only
    when a name is taken from the package, not when a submodule is imported.
    """
    path = _module_file(name)
    if path is None:
        return frozenset()
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _skipped_nodes(tree, lazy)
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if is_package and _discovers(node):
            found.update(submodule_names(name, [path.parent]))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != PACKAGE:
                continue
            # `from . import wan` imports a submodule (the package's __init__ only runs on the
            # way); `from .x import name` takes a name from x, through its lazy attributes too.
            submodules = {f"{base}.{alias.name}" for alias in node.names if _module_file(f"{base}.{alias.name}")}
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(base)
    return frozenset(module for module in found if _module_file(module) is not None)


@cache
def module_closure(name: str) -> tuple[str, ...]:
    """``name`` and every package module it imports, transitively (package __init__s
    too), less ``NOT_RESULT_CODE`` (neither counted nor followed)."""
    # (module, whether its lazy attributes are used): a module imported by name uses
    # them; a package whose __init__ only runs on the way to a submodule does not.
    seen: set[tuple[str, bool]] = set()
    todo = [(name, True)]
    while todo:
        module, lazy = todo.pop()
        if (module, lazy) in seen or (module, True) in seen or _module_file(module) is None:
            continue
        if module in NOT_RESULT_CODE and module != name:
            continue
        seen.add((module, lazy))
        todo.extend((imported, True) for imported in _imports(module, lazy))
        todo.extend((parent, False) for parent in _parents(module))
    return tuple(sorted({module for module, _ in seen}))


@lru_cache(maxsize=1)
def _source_signature() -> str:
    """Size and mtime of every source file of the package, as one short hash."""
    entries = []
    for directory, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                stat = os.stat(os.path.join(directory, name))
                entries.append(f"{directory}/{name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()


_cache: dict[str, str] | None = None


def code_digest(*modules: str) -> str:
    """sha256 (16 hex digits) of the sources of ``modules`` and everything they import."""
    global _cache
    key = ",".join(modules)
    signature = _source_signature()
    path = Path(CACHE)
    if _cache is None:
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):
            stored = {}
        _cache = stored.get("digests", {}) if stored.get("signature") == signature else {}
    if key not in _cache:
        _cache[key] = _digest(modules)
        try:
            from sinkscope.io import atomic_path

            with atomic_path(path) as tmp:
                tmp.write_text(json.dumps({"signature": signature, "digests": _cache}, indent=1))
        except OSError:
            pass  # a read-only working directory: recompute next time
    return _cache[key]


def _digest(modules: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for module in sorted({m for name in modules for m in module_closure(name)}):
        digest.update(module.encode())
        digest.update(code_text(_module_file(module)).encode())
    return digest.hexdigest()[:16]


def code_text(path: Path) -> str:
    """A module's code without its comments, docstrings and layout (an AST dump): editing
    an explanation reruns nothing; a changed string or number in the code does."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


# The package module each pipeline stage runs; figures run their own module (plus the
# shared drawing code). A stage's digest is a param of its rule.
STAGE_MODULES = {
    "encode_prompt": ("sinkscope.pipeline.prompts",),
    "extract_attention": ("sinkscope.pipeline.extract",),
    "import_cache": ("sinkscope.pipeline.imports",),
    "aggregate_source": ("sinkscope.pipeline.aggregate",),
    "combine_tables": ("sinkscope.pipeline.aggregate",),
    "summary_page": ("sinkscope.figures.report",),
    "decode_video": ("sinkscope.pipeline.video",),
    "contact_sheet": (
        "sinkscope.pipeline.contact_sheets",
        "sinkscope.figures.contact_sheet",
        "sinkscope.figures.render",
    ),
    "intervention_head_classes": ("sinkscope.pipeline.headclasses",),
    "variant_effects": ("sinkscope.pipeline.effects",),
    "combine_effects": ("sinkscope.pipeline.aggregate",),
    "atlas_tables": ("sinkscope.pipeline.atlas",),
    "combine_atlas": ("sinkscope.pipeline.aggregate",),
    "atlas_head_orders": ("sinkscope.pipeline.headorders",),
}


def stage_digest(stage: str) -> str:
    """Digest of the package code pipeline stage (or figure kind) ``stage`` runs."""
    if stage in STAGE_MODULES:
        return code_digest(*STAGE_MODULES[stage])
    return code_digest(f"sinkscope.figures.{stage}", "sinkscope.figures.render")
