# Aggregation: per source (checkpoint x variant, or imported cache) its tables, after
# verifying every input; then one combined table of each kind for the study.


rule aggregate_source:
    input:
        lambda wildcards: STUDY.source_inputs(wildcards.source),
    output:
        **{
            table: update(PATTERNS["source_table"].replace("{table}", table))
            for table in SOURCE_TABLES
            if table != "token_profiles"
        },
        token_profiles=update(directory(PATTERNS["source_table"].replace("{table}", "token_profiles"))),
        head_classes=update(PATTERNS["head_classes_csv"]),
    params:
        aggregate=lambda wildcards: STUDY.aggregate_params(wildcards.source),
        code=STUDY.code("aggregate_source"),
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
        **{table: source_tables(table) for table in TABLES},
        token_profiles=source_tables("token_profiles"),
    output:
        **{table: update(path("table", table=table)) for table in TABLES},
        token_profiles=update(directory(path("table", table="token_profiles"))),
    params:
        code=STUDY.code("combine_tables"),
    log:
        "results/logs/combine_tables.log",
    benchmark:
        "results/benchmarks/combine_tables.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/combine_tables.py"
