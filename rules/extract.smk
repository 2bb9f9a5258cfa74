# Extraction: prompt embeddings (once per text encoder and prompt, or per segment of a
# prompt schedule), then one GPU job per source (checkpoint x variant) x prompt x seed x
# layer group that generates a video with the KV-cache procedure and writes one folder
# of per-layer Parquet files plus a manifest. Weights, text encoders and a VAE the generation
# runs enter through their sha256 (params): replaced bytes rerun what used them, a touch
# nothing. Outputs are update(): a failed rerun gives the previous result back instead of
# deleting it. <results> is the study's results folder (config key results).


rule encode_prompt:
    output:
        update("<results>/prompts/{encoder}/{prompt}.safetensors"),
    params:
        encoder=encoder_spec,
        encoder_sha256=encoder_sha256,
        text=prompt_text,
        device=STUDY.device,
        code=STUDY.code("encode_prompt"),
    log:
        "<logs>/encode_prompt/{encoder}/{prompt}.log",
    benchmark:
        "<benchmarks>/encode_prompt/{encoder}/{prompt}.tsv"
    resources:
        gpu=encoder_gpus,
    conda:
        "../envs/torch.yaml"
    script:
        "../scripts/encode_prompt.py"


rule encode_prompt_segment:
    # A prompt schedule (prompts: a list of {text, start_frame}): one embedding per segment.
    output:
        update("<results>/prompts/{encoder}/{prompt}/segment{segment}.safetensors"),
    params:
        encoder=encoder_spec,
        encoder_sha256=encoder_sha256,
        text=segment_text,
        device=STUDY.device,
        code=STUDY.code("encode_prompt"),
    log:
        "<logs>/encode_prompt/{encoder}/{prompt}/segment{segment}.log",
    benchmark:
        "<benchmarks>/encode_prompt/{encoder}/{prompt}/segment{segment}.tsv"
    resources:
        gpu=encoder_gpus,
    conda:
        "../envs/torch.yaml"
    script:
        "../scripts/encode_prompt.py"


rule extract_attention:
    input:
        embedding=prompt_embeddings,
        # Edits that select heads by class wait for the untouched run's classes, those that
        # take the first k heads of a head atlas for its head orders.
        edits=edit_inputs,
    output:
        update(directory("<results>/extract/{source}/{prompt}/seed{seed}/layers{group}")),
    params:
        run=run_params,
        segment_starts=segment_starts,
        weights_sha256=weights_sha256,
        # Krea's re-encode runs the Wan VAE inside the generation; '' for every other run.
        vae_sha256=generation_vae_sha256,
        code=STUDY.code("extract_attention"),
    log:
        "<logs>/extract_attention/{source}/{prompt}/seed{seed}/layers{group}.log",
    benchmark:
        "<benchmarks>/extract_attention/{source}/{prompt}/seed{seed}/layers{group}.tsv"
    wildcard_constraints:
        # The runs alone in their job; a run's folder is always <results>/extract/<run>/....
        source=names(STUDY.single_runs),
    resources:
        gpu=1,
    conda:
        "../envs/torch.yaml"
    script:
        "../scripts/extract_attention.py"


# Several runs a job (runs_per_job): runs of one checkpoint that wait for the same files, for
# one prompt and seed, generated one after another with the model loaded (and compiled)
# once, each into its own folder as extract_attention writes it. Each such job is a rule of
# its own (extract_runs_<n>), its outputs its runs' folders; which runs go together depends
# on their names alone (sinkscope.pipeline.extractplan). Finished runs wait in
# <results>/.staging until the job ends: an interrupted job's next attempt takes them from
# there. Resources: what a profile sets for extract_attention.
for job in STUDY.extraction_jobs:

    rule:
        name:
            job.rule
        input:
            embedding=job_embeddings(job),
            edits=job.inputs,
        output:
            [
                update(directory(f"<results>/extract/{run}/{{prompt}}/seed{{seed}}/layers{group}"))
                for run, group in STUDY.job_folders(job)
            ],
        params:
            runs=job_params(job),
            segment_starts=segment_starts,
            weights_sha256=job_weights_sha256(job),
            vae_sha256=job_vae_sha256(job),
            staging=STUDY.staging,
            code=STUDY.code("extract_attention"),
        log:
            f"<logs>/extract_runs/{job.checkpoint}/{job.label}/{{prompt}}/seed{{seed}}.log",
        benchmark:
            f"<benchmarks>/extract_runs/{job.checkpoint}/{job.label}/{{prompt}}/seed{{seed}}.tsv"
        resources:
            **extraction_resources(),
        conda:
            "../envs/torch.yaml"
        script:
            "../scripts/extract_runs.py"
