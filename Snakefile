# sinkscope: attention-sink analysis of block-causal video diffusion transformers.
#
#   snakemake --cores 1 --resources gpu=1          # the whole study of config.yaml
#   snakemake --report results/report.html         # every figure in one HTML file
#
# Stages (rules/): extract (prompt embeddings, one GPU job per checkpoint x variant x
# prompt x seed x layer group), import (older .pt caches), aggregate (verified Parquet
# tables), figures (SVG + PNG), report (summary page). Paths, params and checks come
# from the sinkscope package (sinkscope.pipeline.study); see README.md.

from snakemake.utils import min_version

min_version("9.11")


configfile: "config.yaml"


include: "rules/common.smk"
include: "rules/extract.smk"
include: "rules/import.smk"
include: "rules/aggregate.smk"
include: "rules/figures.smk"
include: "rules/report.smk"


report: "report/workflow.rst"


rule all:
    default_target: True
    input:
        TARGETS,
