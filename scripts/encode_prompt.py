"""Snakemake job: encode one prompt with one text encoder."""

import _bootstrap  # noqa: F401

from sinkscope.jobs import encode_prompt_job, log_to

log_to(snakemake.log[0])
encode_prompt_job(
    snakemake.params.encoder,
    snakemake.wildcards.prompt,
    snakemake.params.text,
    snakemake.output[0],
    device=snakemake.params.device,
)
