# Paired effects: each variant of a checkpoint against its untouched `default` run of the
# same prompt and seed (latent distance, flicker and drift per latent frame; frame-0 mass
# and entropy per head), from the extraction folders alone (no GPU); then one table of
# each kind for the study. Targets exist only when the study has a `default` variant and
# another (sinkscope.pipeline.study.Study.effect_variants).


rule variant_effects:
    input:
        lambda wildcards: STUDY.effects_inputs(wildcards.checkpoint),
    output:
        **{table: update(PATTERNS["effects_table"].replace("{table}", table)) for table in EFFECT_TABLES},
    params:
        effects=lambda wildcards: STUDY.effects_params(wildcards.checkpoint),
        code=STUDY.code("variant_effects"),
    log:
        "results/logs/variant_effects/{checkpoint}.log",
    benchmark:
        "results/benchmarks/variant_effects/{checkpoint}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/variant_effects.py"


rule combine_effects:
    input:
        **{table: [path("effects_table", checkpoint=c, table=table) for c in STUDY.checkpoints] for table in EFFECT_TABLES},
    output:
        **{table: update(path("table", table=table)) for table in EFFECT_TABLES},
    params:
        code=STUDY.code("combine_effects"),
    log:
        "results/logs/combine_effects.log",
    benchmark:
        "results/benchmarks/combine_effects.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/combine_tables.py"
