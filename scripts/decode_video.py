"""Snakemake job: decode one run's final latents into an MP4 with the checkpoint's Wan VAE."""
# ruff: noqa: F821 - Snakemake defines `snakemake` in the job's globals

import _bootstrap  # noqa: F401

from sinkscope.pipeline.jobs import run_job
from sinkscope.pipeline.video import decode_video_job

video = snakemake.params.video
run_job(
    "decode_video",
    snakemake.log[0],
    decode_video_job,
    extraction=snakemake.input[0],
    output=snakemake.output[0],
    vae=video["vae"],
    fps=video["fps"],
    device=video["device"],
    memory_budget_gib=video["memory_budget_gib"],
)
