# sinkscope: attention-sink analysis of block-causal video diffusion transformers.
#
#   snakemake --cores 1 --resources gpu=1          # the whole study of config.yaml
#   snakemake --cores 1 --resources gpu=1 --configfile configs/longlive.yaml
#                                                  # that study instead (config.yaml is not read)
#   snakemake --report results/report.html         # every figure in one HTML file
#
# Stages (rules/): extract (prompt embeddings, one GPU job per checkpoint x variant x
# prompt x seed x layer group), import (older .pt caches), aggregate (verified Parquet
# tables), effects (each variant against the untouched default run), atlas (sweeps: the
# head, frame and pruning atlases and the head orders pruning runs wait for), figures (SVG +
# PNG), video (outputs.video: MP4s, contact sheets), report (summary page). Each rule
# writes its input and output paths under <results>, the study's results folder (config
# key results); the lists that depend on the study, params and checks come from the
# sinkscope package (sinkscope.pipeline.study and its planners); see README.md.

from snakemake.utils import min_version

# 9.12: path variables (<results>, <logs>, <benchmarks>), which every rule writes its files with.
min_version("9.12")


# The config: config.yaml, or instead only the files given with --configfile (each example
# in configs/ is a whole study); --config overrides go on top of either. rules/common.smk
# reads it and runs the one check.
include: "rules/common.smk"
include: "rules/extract.smk"
include: "rules/import.smk"
include: "rules/aggregate.smk"
include: "rules/effects.smk"
include: "rules/interventions.smk"
include: "rules/atlas.smk"
include: "rules/figures.smk"
include: "rules/video.smk"
include: "rules/report.smk"


report: "report/workflow.rst"


rule all:
    default_target: True
    input:
        TARGETS,
