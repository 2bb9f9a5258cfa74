"""Snakemake job: the per-source tables -> results/tables/."""

import _bootstrap  # noqa: F401

from sinkscope.pipeline.aggregate import combine_job
from sinkscope.pipeline.jobs import run_job

inputs = {name: list(paths) for name, paths in snakemake.input.items()}
run_job("combine_tables", snakemake.log[0], combine_job, inputs, dict(snakemake.output.items()))
