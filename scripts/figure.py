"""Snakemake job: draw one figure (SVG + PNG) of one source, or of one of its layers."""

import _bootstrap  # noqa: F401

from sinkscope.jobs import figure_job, frame_files, log_to

log_to(snakemake.log[0])
layer = snakemake.wildcards.get("layer")
figure_job(
    kind=snakemake.wildcards.kind,
    inputs=frame_files(snakemake.input, None if layer is None else int(layer)),
    source=snakemake.wildcards.source,
    layer=None if layer is None else int(layer),
    options=snakemake.params.options,
    svg=snakemake.output.svg,
    png=snakemake.output.png,
)
