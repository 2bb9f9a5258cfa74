"""Snakemake job: generate one video and capture a group of layers (one folder of Parquet files)."""
# ruff: noqa: F821 - Snakemake defines `snakemake` in the job's globals

import _bootstrap  # noqa: F401

from sinkscope.pipeline.extract import extract_job
from sinkscope.pipeline.jobs import run_job

run = snakemake.params.run
run_job(
    "extract_attention",
    snakemake.log[0],
    extract_job,
    checkpoint=run["checkpoint"],
    variant=run["variant"],
    prompt_id=snakemake.wildcards.prompt,
    seed=int(snakemake.wildcards.seed),
    layers=run["layers"],
    output=snakemake.output[0],
    embedding=list(snakemake.input.embedding),
    segment_starts=snakemake.params.segment_starts,
    weights_sha256=snakemake.params.weights_sha256,
    generation=run["generation"],
    capture=run["capture"],
    compute=run["compute"],
    edit_files=list(snakemake.input.edits),
)
