# Extraction: prompt embeddings (once per text encoder and prompt), weight digests
# (once per checkpoint), then one GPU job per checkpoint x prompt x seed x layer group
# that generates a video with the KV-cache procedure and writes one Parquet per layer.


rule encode_prompt:
    output:
        "results/prompts/{encoder}/{prompt}.safetensors",
    params:
        encoder=lambda wildcards: ENCODERS[wildcards.encoder],
        text=lambda wildcards: config["prompts"][wildcards.prompt],
        device=config["device"],
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


rule checkpoint_digest:
    # The digest (not the weights' mtime) decides whether extraction reruns: a
    # replaced file with new bytes reruns only its checkpoint; a touched one nothing.
    input:
        lambda wildcards: STUDY.weight_files(wildcards.checkpoint),
    output:
        "results/checkpoints/{checkpoint}/digest.json",
    params:
        checkpoint=checkpoint_params,
    log:
        "results/logs/checkpoint_digest/{checkpoint}.log",
    benchmark:
        "results/benchmarks/checkpoint_digest/{checkpoint}.tsv"
    conda:
        "../envs/torch.yaml"
    script:
        "../scripts/checkpoint_digest.py"


rule extract_attention:
    input:
        unpack(extraction_inputs),
    output:
        directory("results/extract/{checkpoint}/{prompt}/seed{seed}/layers{group}"),
    params:
        checkpoint=checkpoint_params,
        layers=group_layers,
        generation=config["generation"],
        backend=config["capture"]["backend"],
        device=config["device"],
    log:
        "results/logs/extract_attention/{checkpoint}/{prompt}/seed{seed}/layers{group}.log",
    benchmark:
        "results/benchmarks/extract_attention/{checkpoint}/{prompt}/seed{seed}/layers{group}.tsv"
    resources:
        gpu=1,
    conda:
        "../envs/torch.yaml"
    script:
        "../scripts/extract_attention.py"
