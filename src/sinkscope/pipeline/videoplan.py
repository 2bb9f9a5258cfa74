"""Which runs get an MP4 and which checkpoints a contact sheet, where they go, what their
rules read (``outputs.video``, ``outputs.contact_sheet``; the jobs: ``sinkscope.pipeline.video``).

- ``outputs.video``: every run (checkpoint, variant, prompt, seed) is decoded by its
  checkpoint's Wan VAE (``model.checkpoints.find_vae``; the config check refuses a
  checkpoint without one) into ``layout.PATTERNS['video']``, and each checkpoint, prompt and
  seed gets a contact sheet of its variants' videos.
- ``outputs.contact_sheet`` alone: the contact sheet from the latents (no VAE needed).

Torch-free: the Snakefile imports it while it parses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sinkscope.model.checkpoints import WAN_VAE_FILES, find_vae, vae_candidates
from sinkscope.naming import encode_layers
from sinkscope.pipeline.layout import DEFAULT_VARIANT

if TYPE_CHECKING:
    from sinkscope.model.checkpoints import ResolvedCheckpoint
    from sinkscope.pipeline.study import Study

# Frames a second of the decoded video, by the model's latent channels: Wan2.1's VAE (16)
# at Wan2.1's 16 fps, Wan2.2's (48) at its 24.
VIDEO_FPS = {16: 16, 48: 24}


def missing_vae(name: str, checkpoint: ResolvedCheckpoint) -> str | None:
    """The config check's line for ``outputs.video`` and a checkpoint without a Wan VAE."""
    if find_vae(checkpoint) is not None:
        return None
    looked = ", ".join(str(p) for p in vae_candidates(checkpoint))
    name_of_file = WAN_VAE_FILES.get(checkpoint.model_config.in_dim, WAN_VAE_FILES[16])
    if not looked:
        return (
            f"config key outputs.video: checkpoint {name!r} has no Wan VAE: no release folder to look for "
            f"{name_of_file} or vae/ in (set its base to one), or set outputs.video: false"
        )
    return (
        f"config key outputs.video: checkpoint {name!r} has no Wan VAE (looked for {looked}); put {name_of_file} "
        "or a diffusers vae/ folder there, or set outputs.video: false"
    )


def videos_on(study: Study) -> bool:
    return bool(study.config.get("outputs", {}).get("video"))


def sheets_on(study: Study) -> bool:
    outputs = study.config.get("outputs", {})
    return bool(outputs.get("video") or outputs.get("contact_sheet"))


def video_fps(checkpoint: ResolvedCheckpoint) -> int:
    return VIDEO_FPS.get(checkpoint.model_config.in_dim, 16)


def sheet_variants(study: Study) -> list[str]:
    """The variants in the contact sheet's rows: the untouched default first."""
    return sorted(study.variants, key=lambda name: name != DEFAULT_VARIANT)


def video_targets(study: Study) -> list[str]:
    """Every MP4 and contact sheet the study's ``outputs`` ask for."""
    targets = []
    runs = [(prompt, seed) for prompt in study.prompts for seed in study.seeds]
    if videos_on(study):
        targets += [
            study.path("video", source=source, prompt=prompt, seed=seed)
            for source in study.runs
            for prompt, seed in runs
        ]
    if sheets_on(study):
        targets += [
            study.path("contact_sheet", checkpoint=checkpoint, prompt=prompt, seed=seed, ext=ext)
            for checkpoint in study.checkpoints
            for prompt, seed in runs
            for ext in ("svg", "png")
        ]
    return targets


def run_latents(study: Study, source: str, prompt: str, seed: int | str) -> str:
    """The extraction folder holding a run's final latents (its first layer group's: every
    group generates the same video)."""
    return study.path(
        "extract_dir", source=source, prompt=prompt, seed=seed, group=encode_layers(study.layer_groups[0])
    )


def video_params(study: Study, source: str) -> dict[str, Any]:
    """The decode job's params: the VAE (path and digest: new bytes rerun it), the frame
    rate, the device and the memory budget."""
    checkpoint = study.checkpoints[study.checkpoint_of(source)]
    vae = find_vae(checkpoint)
    if vae is None:  # the config check refused it already
        raise FileNotFoundError(missing_vae(checkpoint.name, checkpoint))
    budget = study.config.get("max_job_memory_gib")
    return {
        "vae": str(vae),
        "vae_sha256": study.files_sha256(vae),
        "fps": video_fps(checkpoint),
        "device": study.device,
        "memory_budget_gib": budget / 2 if isinstance(budget, (int, float)) else None,
    }


def sheet_inputs(study: Study, checkpoint: str, prompt: str, seed: int | str) -> list[str]:
    """The contact sheet's inputs, one a variant in ``sheet_variants`` order: the MP4s
    (``outputs.video``) or the extraction folders holding the latents."""
    sources = [study.source_name(checkpoint, variant) for variant in sheet_variants(study)]
    if videos_on(study):
        return [study.path("video", source=source, prompt=prompt, seed=seed) for source in sources]
    return [run_latents(study, source, prompt, seed) for source in sources]


def sheet_params(study: Study) -> dict[str, Any]:
    """The contact sheet job's params: the variants in row order, what its inputs are
    (``video`` or ``latent``) and the figure options it draws with."""
    return {
        "variants": sheet_variants(study),
        "unit": "video" if videos_on(study) else "latent",
        "options": study.figure_options("contact_sheet"),
    }
