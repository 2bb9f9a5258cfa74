# The report stage: a summary page of the statistics and the key figures, shown first
# in the `snakemake --report` HTML next to every figure.


rule summary_page:
    input:
        head_stats=path("table", table="head_stats"),
        layer_stats=path("table", table="layer_stats"),
        head_diagnostics=path("table", table="head_diagnostics"),
        # The key figures, shown beside the tables (relative links).
        figures=STUDY.summary_figure_paths(),
    output:
        update(
            report(
                PATTERNS["summary"],
                caption="../report/summary.rst",
                category="Summary",
            )
        ),
    params:
        options=lambda wildcards: STUDY.figure_options("summary"),
        code=STUDY.code("summary_page"),
    log:
        "results/logs/summary_page.log",
    benchmark:
        "results/benchmarks/summary_page.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/summary_page.py"
