# Figures, each as SVG (editable text) and PNG. Each figure job gets only the options
# it draws with and the digest of its own drawing code, so changing a figure option,
# or a figure's code, reruns only those figures. Which kinds each source, layer,
# checkpoint and the study get: sinkscope.pipeline.figureplan.


rule source_figure:
    input:
        figure_tables,
    output:
        **figure_output("<results>/figures/{source}/{kind}.{ext}", "{source}", "Overview", {"figure": "{kind}"}),
    params:
        options=figure_options,
        code=figure_code,
    wildcard_constraints:
        kind="|".join(SOURCE_FIGURES),
    log:
        "<logs>/source_figure/{source}/{kind}.log",
    benchmark:
        "<benchmarks>/source_figure/{source}/{kind}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/figure.py"


rule layer_figure:
    input:
        layer_figure_inputs,
    output:
        **figure_output(
            "<results>/figures/{source}/layer{layer}/{kind}.{ext}",
            "{source}",
            "Layer {layer}",
            {"figure": "{kind}", "layer": "{layer}"},
        ),
    params:
        options=figure_options,
        code=figure_code,
    wildcard_constraints:
        kind="|".join(LAYER_FIGURES),
    log:
        "<logs>/layer_figure/{source}/layer{layer}/{kind}.log",
    benchmark:
        "<benchmarks>/layer_figure/{source}/layer{layer}/{kind}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/figure.py"


rule checkpoint_figure:
    input:
        figure_tables,
    output:
        **figure_output("<results>/figures/{checkpoint}/{kind}.{ext}", "{checkpoint}", "Variants", {"figure": "{kind}"}),
    params:
        options=figure_options,
        code=figure_code,
    wildcard_constraints:
        kind="|".join(CHECKPOINT_FIGURES),
    log:
        "<logs>/checkpoint_figure/{checkpoint}/{kind}.log",
    benchmark:
        "<benchmarks>/checkpoint_figure/{checkpoint}/{kind}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/figure.py"


rule study_figure:
    input:
        study_figure_tables,
    output:
        **figure_output("<results>/figures/{kind}.{ext}", "Study", "Across checkpoints", {"figure": "{kind}"}),
    params:
        options=figure_options,
        code=figure_code,
        train_steps=train_steps,
    wildcard_constraints:
        kind="|".join(STUDY_FIGURES),
    log:
        "<logs>/study_figure/{kind}.log",
    benchmark:
        "<benchmarks>/study_figure/{kind}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/figure.py"
