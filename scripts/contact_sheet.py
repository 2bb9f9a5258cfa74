"""Snakemake job: the contact sheet of one checkpoint's variants for one prompt and seed."""
# ruff: noqa: F821 - Snakemake defines `snakemake` in the job's globals

import _bootstrap  # noqa: F401

from sinkscope.pipeline.contact_sheets import contact_sheet_job
from sinkscope.pipeline.jobs import run_job

sheet = snakemake.params.sheet
run_job(
    "contact_sheet",
    snakemake.log[0],
    contact_sheet_job,
    inputs=list(snakemake.input),
    variants=sheet["variants"],
    checkpoint=snakemake.wildcards.checkpoint,
    prompt_id=snakemake.wildcards.prompt,
    seed=int(snakemake.wildcards.seed),
    unit=sheet["unit"],
    svg=snakemake.output.svg,
    png=snakemake.output.png,
    options=sheet["options"],
    preview=sheet["previews"].get(snakemake.wildcards.checkpoint),
)
