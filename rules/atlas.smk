# Atlases (sweeps:, docs/atlas.md): per checkpoint, its atlas runs against the untouched run
# (head_atlas, frame_atlas, pruning_curve, from its variant_effects table and the untouched
# runs' rows), then one table of each kind for the study. A head sweep that a pruning sweep
# ranks (over: atlas:<head sweep>) gets its head orders first, from its own runs and the
# untouched runs' (not from head_atlas, whose variant_effects pairs the pruning runs too):
# the pruning runs' extraction jobs wait for that file (sinkscope.pipeline.effectsplan).


if STUDY.ranked_atlases:

    rule atlas_head_orders:
        input:
            head_sweep_runs,
        output:
            update("<results>/atlas/{checkpoint}/{sweep}/head_orders.json"),
        params:
            code=STUDY.code("atlas_head_orders"),
        log:
            "<logs>/atlas_head_orders/{checkpoint}/{sweep}.log",
        benchmark:
            "<benchmarks>/atlas_head_orders/{checkpoint}/{sweep}.tsv"
        localrule: True
        conda:
            "../envs/analysis.yaml"
        script:
            "../scripts/head_orders.py"


if STUDY.has_atlas:

    rule atlas_tables:
        input:
            effects=atlas_effects,
            default_runs=atlas_default_runs,
            head_classes=atlas_head_classes,
        output:
            head_atlas=update("<results>/tables/checkpoints/{checkpoint}/head_atlas.parquet"),
            frame_atlas=update("<results>/tables/checkpoints/{checkpoint}/frame_atlas.parquet"),
            pruning_curve=update("<results>/tables/checkpoints/{checkpoint}/pruning_curve.parquet"),
        params:
            atlas=atlas_params,
            code=STUDY.code("atlas_tables"),
        log:
            "<logs>/atlas_tables/{checkpoint}.log",
        benchmark:
            "<benchmarks>/atlas_tables/{checkpoint}.tsv"
        localrule: True
        conda:
            "../envs/analysis.yaml"
        script:
            "../scripts/atlas_tables.py"

    rule combine_atlas:
        input:
            head_atlas=expand("<results>/tables/checkpoints/{checkpoint}/head_atlas.parquet", checkpoint=STUDY.checkpoints),
            frame_atlas=expand("<results>/tables/checkpoints/{checkpoint}/frame_atlas.parquet", checkpoint=STUDY.checkpoints),
            pruning_curve=expand(
                "<results>/tables/checkpoints/{checkpoint}/pruning_curve.parquet", checkpoint=STUDY.checkpoints
            ),
        output:
            head_atlas=update("<results>/tables/head_atlas.parquet"),
            frame_atlas=update("<results>/tables/frame_atlas.parquet"),
            pruning_curve=update("<results>/tables/pruning_curve.parquet"),
        params:
            code=STUDY.code("combine_atlas"),
        log:
            "<logs>/combine_atlas.log",
        benchmark:
            "<benchmarks>/combine_atlas.tsv"
        localrule: True
        conda:
            "../envs/analysis.yaml"
        script:
            "../scripts/combine_tables.py"
