# Extraction: prompt embeddings (once per text encoder and prompt), then one GPU job
# per checkpoint x prompt x seed x layer group that generates a video with the
# KV-cache procedure and writes one Parquet per layer. Weights and text encoders enter
# through their sha256 (params): replaced bytes rerun what used them, a touch nothing.


rule encode_prompt:
    output:
        "results/prompts/{encoder}/{prompt}.safetensors",
    params:
        encoder=lambda wildcards: ENCODERS[wildcards.encoder],
        encoder_sha256=lambda wildcards: ENCODER_SHA256[wildcards.encoder],
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


rule extract_attention:
    input:
        embedding=embedding_of,
    output:
        directory("results/extract/{checkpoint}/{prompt}/seed{seed}/layers{group}"),
    params:
        checkpoint=checkpoint_params,
        weights_sha256=weights_sha256,
        layers=group_layers,
        generation=config["generation"],
        backend=config["capture"]["backend"],
        compile=config["capture"]["compile"],
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
