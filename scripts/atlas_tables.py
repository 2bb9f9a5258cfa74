"""Snakemake job: a checkpoint's variant_effects and untouched runs -> its head_atlas, frame_atlas and pruning_curve."""
# ruff: noqa: F821 - Snakemake defines `snakemake` in the job's globals

import _bootstrap  # noqa: F401

from sinkscope.pipeline.atlas import atlas_job
from sinkscope.pipeline.jobs import run_job

run_job(
    "atlas_tables",
    snakemake.log[0],
    atlas_job,
    list(snakemake.input),
    dict(snakemake.output.items()),
    snakemake.params.atlas,
)
