"""Snakemake job: import one of the older extraction scripts' .pt caches."""

import _bootstrap  # noqa: F401

from sinkscope.pipeline.imports import import_job
from sinkscope.pipeline.jobs import run_job

run_job(
    "import_cache",
    snakemake.log[0],
    import_job,
    snakemake.input[0],
    snakemake.output[0],
    snakemake.wildcards.source,
    snakemake.params.entry,
)
