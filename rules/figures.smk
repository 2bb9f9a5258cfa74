# Figures, each as SVG (editable text) and PNG. Each figure job gets only the
# options it draws with, so changing a figure option reruns only those figures.


rule source_figure:
    input:
        frame_attention="results/tables/checkpoints/{source}/frame_attention.parquet",
    output:
        svg=report(
            "results/figures/{source}/{kind}.svg",
            caption="../report/figure.rst",
            category="{source}",
            subcategory="Overview",
            labels={"figure": "{kind}"},
        ),
        png="results/figures/{source}/{kind}.png",
    params:
        options=figure_options,
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
        lambda wildcards: STUDY.source_inputs(wildcards.source, int(wildcards.layer)),
    output:
        svg=report(
            "results/figures/{source}/layer{layer}/{kind}.svg",
            caption="../report/figure.rst",
            category="{source}",
            subcategory="Layer {layer}",
            labels={"figure": "{kind}", "layer": "{layer}"},
        ),
        png="results/figures/{source}/layer{layer}/{kind}.png",
    params:
        options=figure_options,
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
