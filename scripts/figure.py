"""Snakemake job: draw one figure (SVG + PNG) of a source, a layer, a checkpoint or the study."""

import _bootstrap  # noqa: F401

from sinkscope.figures.render import figure_job
from sinkscope.pipeline.jobs import run_job

wildcards = snakemake.wildcards
run_job(
    f"figure {wildcards.kind}",
    snakemake.log[0],
    figure_job,
    kind=wildcards.kind,
    inputs=list(snakemake.input),
    svg=snakemake.output.svg,
    png=snakemake.output.png,
    options=snakemake.params.options,
    source=wildcards.get("source") or wildcards.get("checkpoint"),
    layer=int(wildcards.layer) if "layer" in wildcards.keys() else None,
    train_steps=snakemake.params.get("train_steps"),
)
