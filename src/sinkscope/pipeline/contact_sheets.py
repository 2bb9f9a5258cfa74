"""The contact sheet job (``outputs.contact_sheet``, and ``outputs.video``): one
checkpoint's variants for one prompt and seed, from their MP4s or, without a VAE, their
latents -> the ``frames`` table (``frames_table``: every 4th video frame, or each latent
frame's first three channels as RGB) -> ``sinkscope.figures.contact_sheet`` -> SVG and PNG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sinkscope.pipeline.latents import read_latents
from sinkscope.pipeline.video import read_mp4

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("sinkscope")

VIDEO_FRAME_STEP = 4  # every 4th video frame: one per latent frame
LATENT_PERCENTILES = (1.0, 99.0)  # the range of a latent channel mapped to 0-255


def latent_images(latents: Mapping[str, np.ndarray], reference: str) -> dict[str, list[np.ndarray]]:
    """Each variant's latents [C, F, H, W] as one uint8 image [H, W, 3] a latent frame: the
    first three channels (the first repeated when there are fewer) as red, green and blue,
    each mapped linearly from its 1st-99th percentile over ``reference``'s frames to 0-255,
    the same mapping for every variant (so that a difference of colour is one of value)."""
    first = np.asarray(latents[reference], dtype=np.float32)
    channels = [min(c, first.shape[0] - 1) for c in range(3)]
    low, high = (np.percentile(first[channels].reshape(3, -1), q, axis=1) for q in LATENT_PERCENTILES)
    span = np.where(high > low, high - low, 1.0)
    images = {}
    for variant, values in latents.items():
        chosen = np.asarray(values, dtype=np.float32)[channels]  # [3, F, H, W]
        scaled = (chosen - low[:, None, None, None]) / span[:, None, None, None]
        pixels = np.clip(np.round(scaled * 255), 0, 255).astype(np.uint8)
        images[variant] = [np.ascontiguousarray(pixels[:, f].transpose(1, 2, 0)) for f in range(pixels.shape[1])]
    return images


def frames_table(
    inputs: Mapping[str, str | Path], *, checkpoint: str, prompt_id: str, seed: int, unit: str
) -> pd.DataFrame:
    """The contact sheet's ``frames`` table: variant -> its MP4 (``unit`` 'video': every 4th
    video frame) or its extraction folder (``unit`` 'latent': every latent frame as an image)."""
    import pandas as pd

    if unit == "video":
        images = {variant: list(read_mp4(path, every=VIDEO_FRAME_STEP)) for variant, path in inputs.items()}
        step = VIDEO_FRAME_STEP
    else:
        reference = "default" if "default" in inputs else next(iter(inputs))
        images = latent_images({variant: read_latents(path) for variant, path in inputs.items()}, reference)
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
) -> None:
    """Draw the contact sheet of one checkpoint, prompt and seed from its variants' MP4s or
    extraction folders (``inputs``, in the order of ``variants``)."""
    from sinkscope.figures.render import draw
    from sinkscope.figures.style import option, save_figure

    began = time.perf_counter()
    frames = frames_table(dict(zip(variants, inputs)), checkpoint=checkpoint, prompt_id=prompt_id, seed=seed, unit=unit)
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
