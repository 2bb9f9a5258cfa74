# Figures, each as SVG (editable text) and PNG. One job draws every figure of a source (every
# layer figure of a source, every figure of a checkpoint's variants, of the study) in one
# process, each as a job of its own would draw it: matplotlib is loaded and each table read
# once a job, not once a figure. Each job gets, per figure, only the options its kind draws
# with, and the digest of each kind's drawing code: changing a figure option, or a figure's
# code, reruns only the jobs that draw that figure. Which kinds (figures.kinds; a variant
# paired with the untouched run gets figures.variant_kinds, fewer by default):
# sinkscope.pipeline.figureplan. The study's runs, its paired variants and imported caches
# differ in their kinds (and imported caches in their layers), so each such set of sources
# has its own rule: run_figures, variant_figures, imported_figures; layer_figures,
# variant_layer_figures, imported_layer_figures.


for figure_set in STUDY.source_figure_sets():

    rule:
        name:
            f"{figure_set.name}_figures"
        input:
            unpack(source_figure_tables),
        output:
            **figure_outputs("<results>/figures/{source}/{kind}.{ext}", figure_set.kinds, "{source}", "Overview"),
        params:
            figures=source_figures,
            code=figure_code(figure_set.kinds),
        wildcard_constraints:
            source=names(figure_set.sources),
        log:
            "<logs>/source_figures/{source}.log",
        benchmark:
            "<benchmarks>/source_figures/{source}.tsv"
        localrule: True
        conda:
            "../envs/analysis.yaml"
        script:
            "../scripts/figures.py"


for figure_set in STUDY.layer_figure_sets():

    rule:
        name:
            f"{figure_set.name}_figures"
        input:
            unpack(layer_figure_tables),
        output:
            **layer_figure_outputs(
                "<results>/figures/{source}/layer{layer}/{kind}.{ext}", figure_set.layers, figure_set.kinds, "{source}"
            ),
        params:
            figures=layer_figures,
            code=figure_code(figure_set.kinds),
        wildcard_constraints:
            source=names(figure_set.sources),
        log:
            "<logs>/layer_figures/{source}.log",
        benchmark:
            "<benchmarks>/layer_figures/{source}.tsv"
        localrule: True
        conda:
            "../envs/analysis.yaml"
        script:
            "../scripts/figures.py"


if STUDY.checkpoint_figure_kinds():

    rule checkpoint_figures:
        input:
            unpack(checkpoint_figure_tables),
        output:
            **figure_outputs(
                "<results>/figures/{checkpoint}/{kind}.{ext}", STUDY.checkpoint_figure_kinds(), "{checkpoint}", "Variants"
            ),
        params:
            figures=checkpoint_figures,
            code=figure_code(STUDY.checkpoint_figure_kinds()),
        log:
            "<logs>/checkpoint_figures/{checkpoint}.log",
        benchmark:
            "<benchmarks>/checkpoint_figures/{checkpoint}.tsv"
        localrule: True
        conda:
            "../envs/analysis.yaml"
        script:
            "../scripts/figures.py"


if STUDY.study_figure_kinds():

    rule study_figures:
        input:
            unpack(study_figure_tables),
        output:
            **figure_outputs(
                "<results>/figures/{kind}.{ext}", STUDY.study_figure_kinds(), "Study", "Across checkpoints"
            ),
        params:
            figures=study_figures,
            code=figure_code(STUDY.study_figure_kinds()),
            train_steps=train_steps,
        log:
            "<logs>/study_figures.log",
        benchmark:
            "<benchmarks>/study_figures.tsv"
        localrule: True
        conda:
            "../envs/analysis.yaml"
        script:
            "../scripts/figures.py"
