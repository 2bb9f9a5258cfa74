"""Snakemake job: a checkpoint's extraction folders -> each variant's paired effects against its default run."""

import _bootstrap  # noqa: F401

from sinkscope.pipeline.effects import effects_job
from sinkscope.pipeline.jobs import run_job

run_job(
    "variant_effects",
    snakemake.log[0],
    effects_job,
    list(snakemake.input),
    dict(snakemake.output.items()),
    snakemake.params.effects,
)
