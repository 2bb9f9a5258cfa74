"""Snakemake job: generate several runs of one checkpoint, prompt and seed, the model loaded once."""
# ruff: noqa: F821 - Snakemake defines `snakemake` in the job's globals

import _bootstrap  # noqa: F401

from sinkscope.pipeline.extract import extract_runs_job
from sinkscope.pipeline.jobs import run_job

run_job(
    "extract_attention",
    snakemake.log[0],
    extract_runs_job,
    job=snakemake.params.runs,
    prompt_id=snakemake.wildcards.prompt,
    seed=int(snakemake.wildcards.seed),
    outputs=list(snakemake.output),
    embedding=list(snakemake.input.embedding),
    segment_starts=snakemake.params.segment_starts,
    weights_sha256=snakemake.params.weights_sha256,
    vae_sha256=snakemake.params.vae_sha256,
    edit_files=list(snakemake.input.edits),
    staging=snakemake.params.staging,
    code=snakemake.params.code,
)
