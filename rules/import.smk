# Import: attention caches written by the older extraction scripts (.pt), turned
# into frame_attention rows that flow through the same aggregation and figures.


rule import_cache:
    input:
        legacy_cache_file,
    output:
        update("<results>/imported/{source}/frame_attention.parquet"),
    params:
        entry=legacy_cache_entry,
        code=STUDY.code("import_cache"),
    log:
        "<logs>/import_cache/{source}.log",
    benchmark:
        "<benchmarks>/import_cache/{source}.tsv"
    conda:
        "../envs/torch.yaml"
    script:
        "../scripts/import_cache.py"
