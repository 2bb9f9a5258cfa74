"""Snakemake job: encode one prompt (or one segment of a prompt schedule) with one text encoder."""
# ruff: noqa: F821 - Snakemake defines `snakemake` in the job's globals

import _bootstrap  # noqa: F401

from sinkscope.pipeline.jobs import run_job
from sinkscope.pipeline.prompts import encode_prompt_job

run_job(
    "encode_prompt",
    snakemake.log[0],
    encode_prompt_job,
    snakemake.params.encoder,
    snakemake.wildcards.prompt,
    snakemake.params.text,
    snakemake.output[0],
    device=snakemake.params.device,
)
