"""Snakemake job: draw every figure of a source, of its layers, of a checkpoint or of the
study (SVG + PNG each) in one process."""

import _bootstrap  # noqa: F401

from sinkscope.figures.render import figures_job
from sinkscope.pipeline.jobs import run_job

source = snakemake.wildcards.get("source") or snakemake.wildcards.get("checkpoint")
figures = {
    name: {
        **figure,
        "inputs": list(getattr(snakemake.input, name)),
        "svg": getattr(snakemake.output, f"{name}_svg"),
        "png": getattr(snakemake.output, f"{name}_png"),
    }
    for name, figure in snakemake.params.figures.items()
}
run_job(
    f"{snakemake.rule} of {source or 'the study'}",
    snakemake.log[0],
    figures_job,
    figures=figures,
    source=source,
    train_steps=snakemake.params.get("train_steps"),
)
