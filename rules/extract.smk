# Extraction: prompt embeddings (once per text encoder and prompt, or per segment of a
# prompt schedule), then one GPU job per source (checkpoint x variant) x prompt x seed x
# layer group that generates a video with the KV-cache procedure and writes one folder
# of per-layer Parquet files plus a manifest. Weights, text encoders and a VAE the generation
# runs enter through their sha256 (params): replaced bytes rerun what used them, a touch
# nothing. Outputs are update(): a failed rerun gives the previous result back instead of
# deleting it.


rule encode_prompt:
    output:
        update(PATTERNS["embedding"]),
    params:
        encoder=lambda wildcards: ENCODERS[wildcards.encoder],
        encoder_sha256=lambda wildcards: STUDY.encoder_sha256(wildcards.encoder),
        text=lambda wildcards: config["prompts"][wildcards.prompt],
        device=STUDY.device,
        code=STUDY.code("encode_prompt"),
    log:
        "results/logs/encode_prompt/{encoder}/{prompt}.log",
    benchmark:
        "results/benchmarks/encode_prompt/{encoder}/{prompt}.tsv"
    resources:
        gpu=lambda wildcards: 0 if ENCODERS[wildcards.encoder]["kind"] == "demo" else 1,
    conda:
        "../envs/torch.yaml"
    script:
        "../scripts/encode_prompt.py"


rule encode_prompt_segment:
    # A prompt schedule (prompts: a list of {text, start_frame}): one embedding per segment.
    output:
        update(PATTERNS["segment_embedding"]),
    params:
        encoder=lambda wildcards: ENCODERS[wildcards.encoder],
        encoder_sha256=lambda wildcards: STUDY.encoder_sha256(wildcards.encoder),
        text=lambda wildcards: STUDY.segment_text(wildcards.prompt, wildcards.segment),
        device=STUDY.device,
        code=STUDY.code("encode_prompt"),
    log:
        "results/logs/encode_prompt/{encoder}/{prompt}/segment{segment}.log",
    benchmark:
        "results/benchmarks/encode_prompt/{encoder}/{prompt}/segment{segment}.tsv"
    resources:
        gpu=lambda wildcards: 0 if ENCODERS[wildcards.encoder]["kind"] == "demo" else 1,
    conda:
        "../envs/torch.yaml"
    script:
        "../scripts/encode_prompt.py"


rule extract_attention:
    input:
        embedding=embedding_of,
        # Edits that select heads by class wait for the untouched run's classes.
        head_classes=lambda wildcards: STUDY.head_classes_inputs(wildcards.source),
    output:
        update(directory(PATTERNS["extract_dir"])),
    params:
        run=extract_params,
        segment_starts=lambda wildcards: STUDY.segment_starts(wildcards.prompt),
        weights_sha256=weights_sha256,
        # Krea's re-encode runs the Wan VAE inside the generation; '' for every other run.
        vae_sha256=lambda wildcards: STUDY.generation_vae_sha256(wildcards.source),
        code=STUDY.code("extract_attention"),
    log:
        "results/logs/extract_attention/{source}/{prompt}/seed{seed}/layers{group}.log",
    benchmark:
        "results/benchmarks/extract_attention/{source}/{prompt}/seed{seed}/layers{group}.tsv"
    resources:
        gpu=1,
    conda:
        "../envs/torch.yaml"
    script:
        "../scripts/extract_attention.py"
