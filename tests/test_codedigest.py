"""Code-aware reruns: each stage's digest covers the code that computes its result, and
nothing else (sinkscope.pipeline.codedigest).

The closures are pinned here: a change of what a stage's digest covers is a visible
change of this file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from test_legacy import token_level_cache

from sinkscope.pipeline.codedigest import STAGE_MODULES, code_text, module_closure

_MODEL = {
    "model",
    "model.checkpoints",
    "model.config",
    "model.formats",
    "model.layout",
    "model.loading",
    "model.lora",
    "model.torchfile",
    "model.weightfiles",
    "model.wan",
    "model.block_kernels",
    "model.layer_graphs",
    "model.rope",
    "attention",
    "attention.settings",
    "attention.split",
    "attention.merge_kernel",
    "attention.biased",
    "attention.flash4",
}
_TABLES = {"tables", "digests"}
_SUMMARIES = {"io", "naming", "schemafile", "stats", "stats.summaries", *_TABLES}


def _declared_in(objects) -> set[str]:
    """The package modules that hold one of ``objects`` at their top level: where it is declared."""
    return {
        name
        for name, module in list(sys.modules.items())
        if name.startswith("sinkscope.") and any(value is obj for value in vars(module).values() for obj in objects)
    }


def registered_modules() -> set[str]:
    """The modules whose code the registries hold: every cache policy class, every generation
    procedure (its declaration, its step rule, its hooks) and every weight format, so that a
    policy, procedure or format added by its recipe (docs/architecture.md) is covered
    without a list here naming it."""
    import sinkscope.generation  # noqa: F401 - imports every procedure module
    from sinkscope.generation.procedures import PROCEDURES
    from sinkscope.model.formats import WEIGHT_FORMATS
    from sinkscope.model.policies import POLICY_CLASSES

    procedures = list(PROCEDURES.values())
    code = [cls for cls in POLICY_CLASSES.values()] + [type(fmt) for fmt in WEIGHT_FORMATS.values()]
    code += [part for p in procedures for part in (p.steps, *p.before_block, *p.after_block)]
    modules = {cls.__module__ for cls in code} | _declared_in(procedures)
    return {module.removeprefix("sinkscope.") for module in modules}


PINNED = {
    "encode_prompt": {"io", *_MODEL, "model.text", "pipeline.prompts"},
    "extract_attention": {
        "io",
        "naming",
        "options",
        "interventions",
        "tokens",
        *_TABLES,
        *_MODEL,
        *registered_modules(),
        "model.cache",
        "model.policies",
        "model.policies.registry",
        "model.text",
        "model.vae",
        "model.generation_edits",
        "model.quantize",
        "generation",
        "generation.capture",
        "generation.common",
        "generation.loop",
        "generation.procedures",
        "generation.sampler",
        "generation.unipc",
        "stats",
        "stats.attention",
        "stats.kernels",
        "stats.reduction_kernels",
        "stats.reference",
        "stats.rollout",
        "stats.launch",
        "stats.launch_support",
        "stats.reductions",
        "stats.tma_kernels",
        "stats.flash4_partials",
        "stats.flash4_kernel",
        "stats.segments",
        "manifests",
        "pipeline.extract",
        "pipeline.integrity",
        "pipeline.latents",
        "pipeline.writing",
    },
    "import_cache": {
        "io",
        *_TABLES,
        *_MODEL,
        "legacy",
        "legacy.importer",
        "legacy.plan",
        "legacy.rows",
        "legacy.frames",
        "legacy.tokens",
        "pipeline.imports",
    },
    "aggregate_source": {*_SUMMARIES, "manifests", "pipeline.aggregate", "pipeline.integrity"},
    "combine_tables": {*_SUMMARIES, "manifests", "pipeline.aggregate", "pipeline.integrity"},
    "summary_page": {*_SUMMARIES, "figures", "figures.report"},
    "intervention_head_classes": {*_SUMMARIES, "interventions", "pipeline.headclasses"},
    "variant_effects": {
        *_SUMMARIES,
        "interventions",
        "manifests",
        "pipeline.aggregate",
        "pipeline.effects",
        "pipeline.integrity",
        "pipeline.latents",
        "sweeps",
    },
    "combine_effects": {*_SUMMARIES, "manifests", "pipeline.aggregate", "pipeline.integrity"},
    "atlas_tables": {
        *_SUMMARIES,
        "interventions",
        "manifests",
        "pipeline.aggregate",
        "pipeline.atlas",
        "pipeline.effects",
        "pipeline.integrity",
        "pipeline.latents",
        "sweeps",
    },
    "combine_atlas": {*_SUMMARIES, "manifests", "pipeline.aggregate", "pipeline.integrity"},
}
# The head orders pair a head sweep's runs as the atlas tables do (its file, the orders alone,
# reruns no pruning run when remade with the same bytes).
PINNED["atlas_head_orders"] = {*PINNED["atlas_tables"], "pipeline.headorders"}


def _closure(modules) -> set[str]:
    return {m.removeprefix("sinkscope.") for name in modules for m in module_closure(name)}


@pytest.mark.parametrize("stage", sorted(PINNED))
def test_each_stage_digest_covers_exactly_its_pinned_modules(stage):
    assert _closure(STAGE_MODULES[stage]) == PINNED[stage]


def test_planning_and_job_plumbing_are_in_no_stage():
    for stage, modules in STAGE_MODULES.items():
        closure = _closure(modules)
        for planning in (
            "pipeline.config",
            "pipeline.study",
            "pipeline.resources",
            "pipeline.jobs",
            "errors",
            "legacy.importer",
        ):
            assert planning not in closure or (stage == "import_cache" and planning == "legacy.importer"), (
                stage,
                planning,
            )


def test_comments_and_docstrings_do_not_count_but_code_does(tmp_path):
    source = '"""Doc."""\n\ndef f(x):\n    """Doc."""\n    return x + 1  # why\n'
    variants = {
        "same": source.replace("Doc.", "Other words.").replace("# why", "# because"),
        "layout": source.replace("x + 1", "(x\n            + 1)"),
        "code": source.replace("x + 1", "x + 2"),
        "message": source.replace("return x + 1", "raise ValueError('new text')"),
    }
    base = tmp_path / "base.py"
    base.write_text(source)
    for name, text in variants.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        assert (code_text(path) == code_text(base)) == (name in ("same", "layout")), name


@pytest.mark.workflow
def test_changed_package_code_reruns_exactly_what_runs_it(tmp_path):
    """A copy of the repository; one edit at a time, undone before the next; a dry run says
    which jobs would rerun."""
    copy = tmp_path / "repo"
    shutil.copytree(
        REPO,
        copy,
        ignore=shutil.ignore_patterns(".git", "results", ".snakemake", "__pycache__", "*.egg-info", ".carry"),
    )
    work = tmp_path / "work"
    work.mkdir()
    torch.save(token_level_cache(layers=(0,), num_frames=6), work / "old_cache.pt")
    (work / "config.yaml").write_text(
        "layers: [0]\ngeneration: {num_frames: 3}\ncapture: {token_profiles: none}\n"
        "legacy_caches: {old: {path: old_cache.pt}}\n"
    )
    env = dict(os.environ, PYTHONPATH=str(copy / "src"))

    def planned() -> dict[str, int]:
        command = [
            sys.executable,
            "-m",
            "snakemake",
            "--snakefile",
            str(copy / "Snakefile"),
            "--directory",
            str(work),
            "--cores",
            "2",
            "--resources",
            "gpu=1",
            "-n",
        ]
        out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=work, check=True).stdout
        if "Job stats:" not in out:
            return {}
        rows = re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:", 1)[1], flags=re.M)
        return {rule: int(count) for rule, count in rows if rule not in ("total", "all")}

    subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--snakefile",
            str(copy / "Snakefile"),
            "--directory",
            str(work),
            "--cores",
            "2",
            "--resources",
            "gpu=1",
        ],
        env=env,
        cwd=work,
        check=True,
        capture_output=True,
    )
    assert planned() == {}

    def after_edit(relative: str, edit) -> dict[str, int]:
        path = copy / "src/sinkscope" / relative
        original = path.read_text()
        path.write_text(edit(original))
        try:
            return planned()
        finally:
            path.write_text(original)

    add_code = lambda text: text + "\n_EDITED = 1\n"  # noqa: E731 - a changed line of code
    # Planning and validation: nothing reruns.
    assert after_edit("pipeline/config.py", add_code) == {}
    assert after_edit("pipeline/resources.py", add_code) == {}
    # An explanation of the statistics: nothing reruns.
    assert after_edit("stats/reference.py", lambda text: text.replace('"""', '"""An edited explanation. ', 1)) == {}
    # The legacy importer: the import and what reads it, no extraction.
    legacy = after_edit("legacy/importer.py", add_code)
    assert legacy.get("import_cache") == 1 and "extract_attention" not in legacy and "encode_prompt" not in legacy
    assert legacy.get("aggregate_source") == 1
    # One figure: the jobs that draw it (the source figures of the run and of the imported
    # cache), and the summary page that shows it; a layer figure: the layer figures alone.
    assert after_edit("figures/figure4.py", add_code) == {"run_figures": 1, "imported_figures": 1, "summary_page": 1}
    assert after_edit("figures/per_head_grid.py", add_code) == {"layer_figures": 1, "imported_layer_figures": 1}
    # The statistics kernel: every extraction, and what depends on it.
    kernel = after_edit("stats/kernels.py", add_code)
    assert kernel.get("extract_attention") == 1 and "import_cache" not in kernel and "encode_prompt" not in kernel
