# Figures, each as SVG (editable text) and PNG. Each figure job gets only the options
# it draws with and the digest of its own drawing code, so changing a figure option,
# or a figure's code, reruns only those figures.


rule source_figure:
    input:
        lambda wildcards: STUDY.figure_inputs(wildcards.kind, wildcards.source),
    output:
        **figure_output(PATTERNS["source_figure"], "{source}", "Overview", {"figure": "{kind}"}),
    params:
        options=figure_options,
        code=figure_code,
    wildcard_constraints:
        kind="|".join(SOURCE_FIGURES),
    log:
        "results/logs/source_figure/{source}/{kind}.log",
    benchmark:
        "results/benchmarks/source_figure/{source}/{kind}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/figure.py"


rule layer_figure:
    input:
        lambda wildcards: STUDY.layer_figure_inputs(wildcards.kind, wildcards.source, int(wildcards.layer)),
    output:
        **figure_output(PATTERNS["layer_figure"], "{source}", "Layer {layer}", {"figure": "{kind}", "layer": "{layer}"}),
    params:
        options=figure_options,
        code=figure_code,
    wildcard_constraints:
        kind="|".join(LAYER_FIGURES),
    log:
        "results/logs/layer_figure/{source}/layer{layer}/{kind}.log",
    benchmark:
        "results/benchmarks/layer_figure/{source}/layer{layer}/{kind}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/figure.py"


rule checkpoint_figure:
    input:
        lambda wildcards: STUDY.figure_inputs(wildcards.kind, wildcards.checkpoint),
    output:
        **figure_output(PATTERNS["checkpoint_figure"], "{checkpoint}", "Variants", {"figure": "{kind}"}),
    params:
        options=figure_options,
        code=figure_code,
    wildcard_constraints:
        kind="|".join(CHECKPOINT_FIGURES),
    log:
        "results/logs/checkpoint_figure/{checkpoint}/{kind}.log",
    benchmark:
        "results/benchmarks/checkpoint_figure/{checkpoint}/{kind}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/figure.py"


rule study_figure:
    input:
        lambda wildcards: STUDY.study_figure_inputs(wildcards.kind),
    output:
        **figure_output(PATTERNS["study_figure"], "Study", "Across checkpoints", {"figure": "{kind}"}),
    params:
        options=figure_options,
        code=figure_code,
        train_steps={name: checkpoint.spec.train_step for name, checkpoint in STUDY.checkpoints.items()},
    wildcard_constraints:
        kind="|".join(STUDY_FIGURES),
    log:
        "results/logs/study_figure/{kind}.log",
    benchmark:
        "results/benchmarks/study_figure/{kind}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/figure.py"
