"""Snakemake job: the per-source tables -> results/tables/*.parquet."""

import _bootstrap  # noqa: F401

from sinkscope.jobs import combine_job, log_to

log_to(snakemake.log[0])
combine_job({name: list(paths) for name, paths in snakemake.input.items()}, dict(snakemake.output.items()))
