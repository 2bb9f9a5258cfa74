"""Snakemake job: one source's per-layer files -> frame_attention, head_stats, layer_stats."""

import _bootstrap  # noqa: F401

from sinkscope.jobs import aggregate_job, frame_files, log_to

log_to(snakemake.log[0])
aggregate_job(frame_files(snakemake.input), dict(snakemake.output.items()), snakemake.wildcards.source)
