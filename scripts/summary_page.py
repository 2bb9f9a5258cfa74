"""Snakemake job: the HTML summary of the statistics tables."""

import _bootstrap  # noqa: F401

from sinkscope.jobs import log_to, summary_job

log_to(snakemake.log[0])
summary_job(snakemake.input.layer_stats, snakemake.input.head_stats, snakemake.output[0], snakemake.params.options)
