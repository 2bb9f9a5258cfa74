# The report stage: a summary page of the statistics, shown first in the
# `snakemake --report` HTML next to every figure.


rule summary_page:
    input:
        head_stats="results/tables/head_stats.parquet",
        layer_stats="results/tables/layer_stats.parquet",
    output:
        report(
            "results/report/summary.html",
            caption="../report/summary.rst",
            category="Summary",
        ),
    params:
        options=lambda wildcards: STUDY.figure_options("summary"),
    log:
        "results/logs/summary_page.log",
    benchmark:
        "results/benchmarks/summary_page.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/summary_page.py"
