# Paired effects: each variant of a checkpoint against its untouched `default` run of the
# same prompt and seed (latent distance, flicker and drift per latent frame; frame-0 mass
# and entropy per head), from the extraction folders alone (no GPU); then one table of
# each kind for the study. Targets exist only when the study has a `default` variant and
# another (sinkscope.pipeline.grid.StudyGrid.effect_variants).


rule variant_effects:
    input:
        paired_runs,
    output:
        variant_effects=update("<results>/tables/checkpoints/{checkpoint}/variant_effects.parquet"),
        variant_head_effects=update("<results>/tables/checkpoints/{checkpoint}/variant_head_effects.parquet"),
    params:
        effects=effects_params,
        code=STUDY.code("variant_effects"),
    log:
        "<logs>/variant_effects/{checkpoint}.log",
    benchmark:
        "<benchmarks>/variant_effects/{checkpoint}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/variant_effects.py"


rule combine_effects:
    input:
        variant_effects=expand(
            "<results>/tables/checkpoints/{checkpoint}/variant_effects.parquet", checkpoint=STUDY.checkpoints
        ),
        variant_head_effects=expand(
            "<results>/tables/checkpoints/{checkpoint}/variant_head_effects.parquet", checkpoint=STUDY.checkpoints
        ),
    output:
        variant_effects=update("<results>/tables/variant_effects.parquet"),
        variant_head_effects=update("<results>/tables/variant_head_effects.parquet"),
    params:
        code=STUDY.code("combine_effects"),
    log:
        "<logs>/combine_effects.log",
    benchmark:
        "<benchmarks>/combine_effects.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/combine_tables.py"
