"""Snakemake job: one source's extraction folders -> its verified tables."""

import _bootstrap  # noqa: F401

from sinkscope.pipeline.aggregate import aggregate_job
from sinkscope.pipeline.jobs import run_job

run_job(
    "aggregate_source",
    snakemake.log[0],
    aggregate_job,
    list(snakemake.input),
    dict(snakemake.output.items()),
    snakemake.params.aggregate,
)
