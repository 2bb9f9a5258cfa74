# Edits that select heads by class (generation.interventions, heads: class:<head class>),
# and atlases (sweeps:): per checkpoint, the untouched default run's head classes, read from
# its head_diagnostics table; the extraction jobs of the variants that select by class wait
# for this file, and only those (sinkscope.pipeline.extractplan.ExtractionPlan.edit_inputs);
# the atlas tables give each head's class beside its drift.


rule intervention_head_classes:
    input:
        untouched_head_diagnostics,
    output:
        update("<results>/interventions/{checkpoint}/head_classes.json"),
    params:
        code=STUDY.code("intervention_head_classes"),
    log:
        "<logs>/intervention_head_classes/{checkpoint}.log",
    benchmark:
        "<benchmarks>/intervention_head_classes/{checkpoint}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/head_classes.py"
