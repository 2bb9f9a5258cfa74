"""Snakemake job: generate one video and capture a group of layers (one Parquet each)."""

import _bootstrap  # noqa: F401

from sinkscope.jobs import extract_job, log_to
from sinkscope.workflow import Study

log_to(snakemake.log[0])
layers = snakemake.params.layers
extract_job(
    checkpoint=snakemake.params.checkpoint,
    prompt_id=snakemake.wildcards.prompt,
    seed=int(snakemake.wildcards.seed),
    layers=layers,
    outputs=[Study.layer_file(snakemake.output[0], layer) for layer in layers],
    embedding=snakemake.input.embedding,
    weights_sha256=snakemake.params.weights_sha256,
    generation=snakemake.params.generation,
    backend=snakemake.params.backend,
    compile=snakemake.params.compile,
    device=snakemake.params.device,
)
