"""Snakemake job: sha256 of a checkpoint's weight files."""

import _bootstrap  # noqa: F401

from sinkscope.jobs import digest_job, log_to

log_to(snakemake.log[0])
digest_job(snakemake.params.checkpoint, snakemake.output[0])
