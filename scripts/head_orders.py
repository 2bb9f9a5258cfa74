"""Snakemake job: a head sweep's runs and the untouched runs -> the sweep's head orders (the pruning runs' heads)."""
# ruff: noqa: F821 - Snakemake defines `snakemake` in the job's globals

import _bootstrap  # noqa: F401

from sinkscope.pipeline.headorders import head_orders_job
from sinkscope.pipeline.jobs import run_job

run_job(
    "atlas_head_orders",
    snakemake.log[0],
    head_orders_job,
    folders=list(snakemake.input),
    output=snakemake.output[0],
    checkpoint=snakemake.wildcards.checkpoint,
    sweep=snakemake.wildcards.sweep,
)
