"""The file tree under a study's results folder, defined once.

Each entry of ``PATTERNS`` is a path pattern as the rules in ``rules/*.smk`` write it:
``<results>`` is the study's results folder (Snakemake's path variable, set from the
config key ``results``), ``{wildcards}`` are filled per job. The rules spell their
patterns out; ``tests/test_layout.py`` checks that they equal these, so the package
(targets, inputs, integrity, recovery) and the rules cannot drift apart.

A source name may hold a ``/`` (a sweep's variant ``<sweep>/<item>``): it then stands
for nested folders, in every pattern alike.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from sinkscope.errors import ConfigError

# The default results folder (config.yaml's study); each example config names its own.
RESULTS = "results"
# Snakemake's path variable for the results folder, as the rules write it.
RESULTS_VAR = "<results>"
DEFAULT_VARIANT = "default"
VARIANT_SEPARATOR = "@"

# Tables per source (and combined over sources); token_profiles only with token capture.
TABLES = ("frame_attention", "head_stats", "layer_stats", "block_stats", "head_diagnostics")
SOURCE_TABLES = (*TABLES, "query_stats", "token_profiles")
# Per checkpoint (and combined): each variant paired with the untouched default run.
EFFECT_TABLES = ("variant_effects", "variant_head_effects")
# Per checkpoint (and combined): its sweeps' runs against the untouched run (sinkscope.pipeline.atlas).
ATLAS_TABLES = ("head_atlas", "frame_atlas", "pruning_curve")
# Under the results folder: the runs a job of several runs finished, until the job moves them
# into place (an interrupted job's next attempt takes them from here; sinkscope.pipeline.extract).
STAGING = ".staging"

PATTERNS = {
    "embedding": "<results>/prompts/{encoder}/{prompt}.safetensors",
    # A prompt schedule: one embedding per segment.
    "segment_embedding": "<results>/prompts/{encoder}/{prompt}/segment{segment}.safetensors",
    "extract_dir": "<results>/extract/{source}/{prompt}/seed{seed}/layers{group}",
    "imported": "<results>/imported/{source}/frame_attention.parquet",
    "source_table": "<results>/tables/checkpoints/{source}/{table}.parquet",
    "head_classes_csv": "<results>/tables/checkpoints/{source}/head_classes.csv",
    "table": "<results>/tables/{table}.parquet",
    "source_figure": "<results>/figures/{source}/{kind}.{ext}",
    "layer_figure": "<results>/figures/{source}/layer{layer}/{kind}.{ext}",
    "checkpoint_figure": "<results>/figures/{checkpoint}/{kind}.{ext}",
    "study_figure": "<results>/figures/{kind}.{ext}",
    "summary": "<results>/report/summary.html",
    # outputs.video / outputs.contact_sheet (sinkscope.pipeline.videoplan).
    "video": "<results>/videos/{source}/{prompt}/seed{seed}.mp4",
    "contact_sheet": "<results>/figures/{checkpoint}/contact_sheet/{prompt}/seed{seed}.{ext}",
    # The untouched (default) run's head classes, for edits that select heads by class.
    "intervention_classes": "<results>/interventions/{checkpoint}/head_classes.json",
    "effects_table": "<results>/tables/checkpoints/{checkpoint}/{table}.parquet",
    # A head sweep's heads in the orders the pruning curve takes them (sinkscope.pipeline.headorders).
    "head_orders": "<results>/atlas/{checkpoint}/{sweep}/head_orders.json",
}
# The folder of every job's log and benchmark (Snakemake's <logs> and <benchmarks>).
LOGS = "<results>/logs"
BENCHMARKS = "<results>/benchmarks"


def path(name: str, results: str = RESULTS, **wildcards: Any) -> str:
    """A results path: ``PATTERNS[name]`` in the folder ``results``, its wildcards filled in."""
    return PATTERNS[name].replace(RESULTS_VAR, results).format(**wildcards)


def source_name(checkpoint: str, variant: str) -> str:
    """A checkpoint's default run is named like the checkpoint; another variant's run
    ``<checkpoint>@<variant>``."""
    return checkpoint if variant == DEFAULT_VARIANT else f"{checkpoint}{VARIANT_SEPARATOR}{variant}"


def results_folder(value: Any) -> str:
    """The config key ``results`` as the folder every pattern starts with (``results/`` ->
    ``results``); a ConfigError for what cannot be one."""
    text = str(value).strip()
    folder = PurePosixPath(text)
    problem = None
    if not text or folder == PurePosixPath("."):
        problem = "is the working directory itself; name a folder inside it (e.g. results/my-study)"
    elif ".." in folder.parts:
        problem = "climbs out with '..'; name a folder inside the working directory, or an absolute path"
    elif any(char in text for char in "{}<>\\"):
        problem = "holds one of { } < > \\, which path patterns reserve"
    elif folder.parts[0] == ".snakemake":
        problem = "is inside .snakemake/, which Snakemake owns"
    if problem:
        raise ConfigError.invalid([f"config key results: {text!r} {problem}"])
    return str(folder)
