# The report stage: a summary page of the statistics and the key figures, shown first
# in the `snakemake --report` HTML next to every figure.


rule summary_page:
    input:
        head_stats="<results>/tables/head_stats.parquet",
        layer_stats="<results>/tables/layer_stats.parquet",
        head_diagnostics="<results>/tables/head_diagnostics.parquet",
        # The key figures, shown beside the tables (relative links).
        figures=STUDY.summary_figure_paths(),
    output:
        update(report("<results>/report/summary.html", caption="../report/summary.rst", category="Summary")),
    params:
        options=STUDY.figure_options("summary"),
        code=STUDY.code("summary_page"),
    log:
        "<logs>/summary_page.log",
    benchmark:
        "<benchmarks>/summary_page.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/summary_page.py"
