"""Snakemake job: a checkpoint's untouched run's head classes, for edits that select heads by class."""
# ruff: noqa: F821 - Snakemake defines `snakemake` in the job's globals

import _bootstrap  # noqa: F401

from sinkscope.pipeline.headclasses import head_classes_job
from sinkscope.pipeline.jobs import run_job

run_job(
    "intervention_head_classes",
    snakemake.log[0],
    head_classes_job,
    diagnostics=snakemake.input[0],
    output=snakemake.output[0],
)
