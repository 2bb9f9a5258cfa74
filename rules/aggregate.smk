# Aggregation: per source (checkpoint x variant, or imported cache) its tables, after
# verifying every input; then one combined table of each kind for the study.


rule aggregate_source:
    input:
        frame_inputs,
    output:
        frame_attention=update("<results>/tables/checkpoints/{source}/frame_attention.parquet"),
        head_stats=update("<results>/tables/checkpoints/{source}/head_stats.parquet"),
        layer_stats=update("<results>/tables/checkpoints/{source}/layer_stats.parquet"),
        block_stats=update("<results>/tables/checkpoints/{source}/block_stats.parquet"),
        head_diagnostics=update("<results>/tables/checkpoints/{source}/head_diagnostics.parquet"),
        query_stats=update("<results>/tables/checkpoints/{source}/query_stats.parquet"),
        # A Parquet dataset folder (a file per run and layer), written with capture.token_profiles.
        token_profiles=update(directory("<results>/tables/checkpoints/{source}/token_profiles.parquet")),
        head_classes=update("<results>/tables/checkpoints/{source}/head_classes.csv"),
    params:
        aggregate=aggregate_params,
        code=STUDY.code("aggregate_source"),
    log:
        "<logs>/aggregate_source/{source}.log",
    benchmark:
        "<benchmarks>/aggregate_source/{source}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/aggregate.py"


rule combine_tables:
    input:
        frame_attention=expand("<results>/tables/checkpoints/{source}/frame_attention.parquet", source=STUDY.sources),
        head_stats=expand("<results>/tables/checkpoints/{source}/head_stats.parquet", source=STUDY.sources),
        layer_stats=expand("<results>/tables/checkpoints/{source}/layer_stats.parquet", source=STUDY.sources),
        block_stats=expand("<results>/tables/checkpoints/{source}/block_stats.parquet", source=STUDY.sources),
        head_diagnostics=expand("<results>/tables/checkpoints/{source}/head_diagnostics.parquet", source=STUDY.sources),
        token_profiles=expand("<results>/tables/checkpoints/{source}/token_profiles.parquet", source=STUDY.sources),
    output:
        frame_attention=update("<results>/tables/frame_attention.parquet"),
        head_stats=update("<results>/tables/head_stats.parquet"),
        layer_stats=update("<results>/tables/layer_stats.parquet"),
        block_stats=update("<results>/tables/block_stats.parquet"),
        head_diagnostics=update("<results>/tables/head_diagnostics.parquet"),
        token_profiles=update(directory("<results>/tables/token_profiles.parquet")),
    params:
        code=STUDY.code("combine_tables"),
    log:
        "<logs>/combine_tables.log",
    benchmark:
        "<benchmarks>/combine_tables.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/combine_tables.py"
