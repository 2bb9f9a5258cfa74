"""Snakemake job: encode one prompt with one text encoder."""

import _bootstrap  # noqa: F401

from sinkscope.pipeline.prompts import encode_prompt_job
from sinkscope.pipeline.jobs import run_job

run_job("encode_prompt", snakemake.log[0], encode_prompt_job, snakemake.params.encoder, snakemake.wildcards.prompt,
        snakemake.params.text, snakemake.output[0], device=snakemake.params.device)  # fmt: skip
