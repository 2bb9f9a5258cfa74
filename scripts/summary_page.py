"""Snakemake job: the HTML summary of the statistics tables."""

import _bootstrap  # noqa: F401

from sinkscope.figures.report import summary_job
from sinkscope.pipeline.jobs import run_job

run_job(
    "summary_page",
    snakemake.log[0],
    summary_job,
    snakemake.input.layer_stats,
    snakemake.input.head_stats,
    snakemake.input.head_diagnostics,
    snakemake.output[0],
    snakemake.params.options,
)
