# Videos (outputs.video): each run's final latents, kept in its extraction folder, decoded
# by the checkpoint's Wan VAE into an MP4 (one GPU job a run); and the contact sheet of a
# checkpoint's variants for one prompt and seed (outputs.video, or outputs.contact_sheet
# alone: drawn from the latents). Which runs and files: sinkscope.pipeline.videoplan.

from sinkscope.pipeline.videoplan import run_latents, sheet_inputs, sheet_params, video_params


rule decode_video:
    input:
        lambda wildcards: run_latents(STUDY, wildcards.source, wildcards.prompt, wildcards.seed),
    output:
        update(PATTERNS["video"]),
    params:
        video=lambda wildcards: video_params(STUDY, wildcards.source),
        code=STUDY.code("decode_video"),
    log:
        "results/logs/decode_video/{source}/{prompt}/seed{seed}.log",
    benchmark:
        "results/benchmarks/decode_video/{source}/{prompt}/seed{seed}.tsv"
    resources:
        gpu=1,
    conda:
        "../envs/torch.yaml"
    script:
        "../scripts/decode_video.py"


rule contact_sheet:
    input:
        lambda wildcards: sheet_inputs(STUDY, wildcards.checkpoint, wildcards.prompt, wildcards.seed),
    output:
        **figure_output(PATTERNS["contact_sheet"], "{checkpoint}", "Contact sheets",
                        {"figure": "contact_sheet", "prompt": "{prompt}", "seed": "{seed}"}),
    params:
        sheet=lambda wildcards: sheet_params(STUDY),
        code=STUDY.code("contact_sheet"),
    log:
        "results/logs/contact_sheet/{checkpoint}/{prompt}/seed{seed}.log",
    benchmark:
        "results/benchmarks/contact_sheet/{checkpoint}/{prompt}/seed{seed}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/contact_sheet.py"
