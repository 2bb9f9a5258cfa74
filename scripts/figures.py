"""Snakemake job: draw every figure of a source, a layer of a source, a checkpoint or the
study (SVG + PNG each), in one process."""

import _bootstrap  # noqa: F401

from sinkscope.figures.render import figures_job
from sinkscope.pipeline.jobs import run_job

wildcards = snakemake.wildcards
figures = {
    kind: {
        "inputs": list(getattr(snakemake.input, kind)),
        "svg": getattr(snakemake.output, f"{kind}_svg"),
        "png": getattr(snakemake.output, f"{kind}_png"),
        "options": options,
    }
    for kind, options in snakemake.params.options.items()
}
source = wildcards.get("source") or wildcards.get("checkpoint")
run_job(
    f"figures of {source or 'the study'}" + (f" layer {wildcards.layer}" if "layer" in wildcards.keys() else ""),
    snakemake.log[0],
    figures_job,
    figures=figures,
    source=source,
    layer=int(wildcards.layer) if "layer" in wildcards.keys() else None,
    train_steps=snakemake.params.get("train_steps"),
)
