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

from sinkscope.model.checkpoints import find_vae
from sinkscope.model.config import MODEL_CONFIGS
from sinkscope.naming import encode_layers
from sinkscope.pipeline.config import missing_vae
from sinkscope.pipeline.layout import DEFAULT_VARIANT

if TYPE_CHECKING:
    from sinkscope.model.checkpoints import ResolvedCheckpoint
    from sinkscope.pipeline.figureplan import FigurePlan

# Frames a second of the decoded video, by the model's latent channels: Wan2.1's VAE (16)
# at Wan2.1's 16 fps, Wan2.2's (48) at its 24.
VIDEO_FPS = {16: 16, 48: 24}
# The latent preview of a model's latents without a VAE, by its latent channels
# (sinkscope.model.latent_preview; the demo's latents have a preview of their own).
LATENT_PREVIEWS = {16: "wan2.1", 48: "wan2.2"}


def videos_on(study: FigurePlan) -> bool:
    return bool(study.config.get("outputs", {}).get("video"))


def sheets_on(study: FigurePlan) -> bool:
    outputs = study.config.get("outputs", {})
    return bool(outputs.get("video") or outputs.get("contact_sheet"))


def video_fps(checkpoint: ResolvedCheckpoint) -> int:
    return VIDEO_FPS.get(checkpoint.model_config.in_dim, 16)


def latent_preview(checkpoint: ResolvedCheckpoint) -> str:
    """Which fixed latent-to-RGB projection shows the checkpoint's latents without a VAE:
    the demo's for the demo model (whose latents are the synthetic data's, not a VAE's),
    else the Wan VAE's of its latent width, else ``channels`` (channels 0-2 stretched)."""
    if checkpoint.model_config == MODEL_CONFIGS["demo"]:
        return "demo"
    return LATENT_PREVIEWS.get(checkpoint.model_config.in_dim, "channels")


def sheet_variants(study: FigurePlan) -> list[str]:
    """The variants in the contact sheet's rows: the untouched default first."""
    return sorted(study.variants, key=lambda name: name != DEFAULT_VARIANT)


def video_targets(study: FigurePlan) -> list[str]:
    """Every MP4 and contact sheet the study's ``outputs`` ask for (atlas runs get none)."""
    targets = []
    runs = [(prompt, seed) for prompt in study.prompts for seed in study.seeds]
    if videos_on(study):
        targets += [
            study.path("video", source=source, prompt=prompt, seed=seed)
            for source in study.runs
            if not study.is_atlas_run(source)
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


def run_latents(study: FigurePlan, source: str, prompt: str, seed: int | str) -> str:
    """The extraction folder holding a run's final latents (its first layer group's: every
    group generates the same video)."""
    return study.path(
        "extract_dir", source=source, prompt=prompt, seed=seed, group=encode_layers(study.layer_groups[0])
    )


def video_params(study: FigurePlan, source: str) -> dict[str, Any]:
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


def sheet_inputs(study: FigurePlan, checkpoint: str, prompt: str, seed: int | str) -> list[str]:
    """The contact sheet's inputs, one a variant in ``sheet_variants`` order: the MP4s
    (``outputs.video``) or the extraction folders holding the latents."""
    sources = [study.source_name(checkpoint, variant) for variant in sheet_variants(study)]
    if videos_on(study):
        return [study.path("video", source=source, prompt=prompt, seed=seed) for source in sources]
    return [run_latents(study, source, prompt, seed) for source in sources]


def sheet_params(study: FigurePlan) -> dict[str, Any]:
    """The contact sheet job's params: the variants in row order, what its inputs are
    (``video`` or ``latent``), the figure options it draws with and, from latents, each
    checkpoint's latent preview."""
    videos = videos_on(study)
    return {
        "variants": sheet_variants(study),
        "unit": "video" if videos else "latent",
        "options": study.figure_options("contact_sheet"),
        "previews": {} if videos else {name: latent_preview(ck) for name, ck in study.checkpoints.items()},
    }
