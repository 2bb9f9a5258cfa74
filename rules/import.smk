# Import: attention caches written by the older extraction scripts (.pt), turned
# into frame_attention rows that flow through the same aggregation and figures.


rule import_cache:
    input:
        lambda wildcards: config["legacy_caches"][wildcards.source]["path"],
    output:
        update(PATTERNS["imported"]),
    params:
        entry=lambda wildcards: config["legacy_caches"][wildcards.source],
        code=STUDY.code("import_cache"),
    log:
        "results/logs/import_cache/{source}.log",
    benchmark:
        "results/benchmarks/import_cache/{source}.tsv"
    conda:
        "../envs/torch.yaml"
    script:
        "../scripts/import_cache.py"
