# Videos (outputs.video): each run's final latents, kept in its extraction folder, decoded
# by the checkpoint's Wan VAE into an MP4 (one GPU job a run); and the contact sheet of a
# checkpoint's variants for one prompt and seed (outputs.video, or outputs.contact_sheet
# alone: drawn from the latents). Which runs and files: sinkscope.pipeline.videoplan.


rule decode_video:
    input:
        latents_folder,
    output:
        update("<results>/videos/{source}/{prompt}/seed{seed}.mp4"),
    params:
        video=video_params,
        code=STUDY.code("decode_video"),
    log:
        "<logs>/decode_video/{source}/{prompt}/seed{seed}.log",
    benchmark:
        "<benchmarks>/decode_video/{source}/{prompt}/seed{seed}.tsv"
    resources:
        gpu=1,
    conda:
        "../envs/torch.yaml"
    script:
        "../scripts/decode_video.py"


rule contact_sheet:
    input:
        sheet_frames,
    output:
        **figure_output(
            "<results>/figures/{checkpoint}/contact_sheet/{prompt}/seed{seed}.{ext}",
            "{checkpoint}",
            "Contact sheets",
            {"figure": "contact_sheet", "prompt": "{prompt}", "seed": "{seed}"},
        ),
    params:
        sheet=sheet_params(STUDY),
        code=STUDY.code("contact_sheet"),
    log:
        "<logs>/contact_sheet/{checkpoint}/{prompt}/seed{seed}.log",
    benchmark:
        "<benchmarks>/contact_sheet/{checkpoint}/{prompt}/seed{seed}.tsv"
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../scripts/contact_sheet.py"
