# Aggregation: per source (checkpoint or imported cache) the frame_attention,
# head_stats and layer_stats tables; then one combined table of each kind.


rule aggregate_source:
    input:
        lambda wildcards: STUDY.source_inputs(wildcards.source),
    output:
        frame_attention="results/tables/checkpoints/{source}/frame_attention.parquet",
        head_stats="results/tables/checkpoints/{source}/head_stats.parquet",
        layer_stats="results/tables/checkpoints/{source}/layer_stats.parquet",
    log:
        "results/logs/aggregate_source/{source}.log",
    benchmark:
        "results/benchmarks/aggregate_source/{source}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/aggregate.py"


rule combine_tables:
    input:
        frame_attention=source_tables("frame_attention"),
        head_stats=source_tables("head_stats"),
        layer_stats=source_tables("layer_stats"),
    output:
        frame_attention="results/tables/frame_attention.parquet",
        head_stats="results/tables/head_stats.parquet",
        layer_stats="results/tables/layer_stats.parquet",
    log:
        "results/logs/combine_tables.log",
    benchmark:
        "results/benchmarks/combine_tables.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/combine_tables.py"
