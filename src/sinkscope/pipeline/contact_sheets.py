"""The contact sheet job (``outputs.contact_sheet``, and ``outputs.video``): one
checkpoint's variants for one prompt and seed, from their MP4s or, without a VAE, their
latents -> the ``frames`` table (``frames_table``: every 4th video frame, or each latent
frame in the fixed latent-to-RGB projection of the checkpoint's latent space,
``sinkscope.model.latent_preview``) -> ``sinkscope.figures.contact_sheet`` -> SVG and PNG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sinkscope.model.latent_preview import CHANNELS, preview_rgb
from sinkscope.pipeline.latents import read_latents
from sinkscope.pipeline.video import read_mp4

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("sinkscope")

VIDEO_FRAME_STEP = 4  # every 4th video frame: one per latent frame


def latent_images(latents: Mapping[str, np.ndarray], preview: str, reference: str) -> dict[str, list[np.ndarray]]:
    """Each variant's latents [C, F, H, W] as one uint8 image [H, W, 3] a latent frame, by
    the fixed projection ``preview`` (``sinkscope.model.latent_preview``; its ``channels``
    fallback stretches by ``reference``'s frames, the same mapping for every variant, so
    that a difference of colour is one of value)."""
    base = np.asarray(latents[reference], dtype=np.float32)
    return {
        variant: list(preview_rgb(values, preview, reference=base if preview == CHANNELS else None))
        for variant, values in latents.items()
    }


def frames_table(
    inputs: Mapping[str, str | Path],
    *,
    checkpoint: str,
    prompt_id: str,
    seed: int,
    unit: str,
    preview: str | None = None,
) -> pd.DataFrame:
    """The contact sheet's ``frames`` table: variant -> its MP4 (``unit`` 'video': every 4th
    video frame) or its extraction folder (``unit`` 'latent': every latent frame as an image
    by the latent preview ``preview``, ``videoplan.latent_preview`` of the checkpoint)."""
    import pandas as pd

    if unit == "video":
        images = {variant: list(read_mp4(path, every=VIDEO_FRAME_STEP)) for variant, path in inputs.items()}
        step = VIDEO_FRAME_STEP
    else:
        if preview is None:
            raise ValueError("latent frames need the checkpoint's latent preview (videoplan.latent_preview)")
        reference = "default" if "default" in inputs else next(iter(inputs))
        images = latent_images({variant: read_latents(path) for variant, path in inputs.items()}, preview, reference)
        step = 1
    rows = [
        {
            "checkpoint": checkpoint,
            "variant": variant,
            "prompt_id": prompt_id,
            "seed": int(seed),
            "frame": i * step,
            "image": image,
            "unit": unit,
            **({"preview": preview} if unit == "latent" else {}),
        }
        for variant, frames in images.items()
        for i, image in enumerate(frames)
    ]
    return pd.DataFrame(rows)


def contact_sheet_job(
    *,
    inputs: Sequence[str | Path],
    variants: Sequence[str],
    checkpoint: str,
    prompt_id: str,
    seed: int,
    unit: str,
    svg: str | Path,
    png: str | Path,
    options: Mapping[str, Any],
    preview: str | None = None,
) -> None:
    """Draw the contact sheet of one checkpoint, prompt and seed from its variants' MP4s or
    extraction folders (``inputs``, in the order of ``variants``; ``preview``: the latent
    preview of the checkpoint's latents, for ``unit`` 'latent')."""
    from sinkscope.figures.render import draw
    from sinkscope.figures.style import option, save_figure

    began = time.perf_counter()
    frames = frames_table(
        dict(zip(variants, inputs)), checkpoint=checkpoint, prompt_id=prompt_id, seed=seed, unit=unit, preview=preview
    )
    fig = draw("contact_sheet", {"frames": frames}, source=checkpoint, options=options)
    save_figure(fig, svg, png, dpi=int(option(options, "dpi")))
    log.info(
        "contact sheet of %s, %s seed %d (%d variants, %s) in %.2f s",
        checkpoint,
        prompt_id,
        seed,
        len(variants),
        unit,
        time.perf_counter() - began,
    )
