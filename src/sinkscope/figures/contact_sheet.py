"""A run's video at a glance, one row per variant: every 4th video frame (video frames
0, 4, 8, ...: one per latent frame, the last video frame each latent stands for), the
untouched ``default`` video on top, so that an edit's effect is seen against its control
frame by frame. Without a VAE the rows show the latents themselves, one image per latent
frame, in the fixed latent-to-RGB projection of their latent space (the table's
``preview``: ``sinkscope.model.latent_preview``), drawn smoothly enlarged (bilinear) when
they are small, as latent previews are shown.

The ``frames`` table holds the images (uint8 [H, W, 3] arrays, one row per variant and
frame); ``sinkscope.pipeline.contact_sheets`` reads them from the decoded MP4s or the
latents. A long row wraps onto several lines so that every frame stays readable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from sinkscope.figures.layout import finish, new_figure
from sinkscope.figures.style import option
from sinkscope.figures.text import runs_text
from sinkscope.figures.views import one_checkpoint, table, variants_in
from sinkscope.model.latent_preview import CHANNELS, preview_text

WIDTH = 18.0  # inches of frames a line holds at most
FRAME_HEIGHT = 0.75  # inches a frame is drawn at, at least
GAP = 2  # pixels between frames
# Images lower than this (latents: the demo's are 8 pixels high) are enlarged by a whole
# factor with bilinear interpolation, so that a blob reads as a blob and not as squares.
SMOOTH_BELOW = 32


def enlarged(image: np.ndarray, factor: int) -> np.ndarray:
    """uint8 [H, W, 3] -> [factor H, factor W, 3], bilinear between pixel centres (the
    edges held): each output pixel's centre mapped back onto the input grid."""
    if factor == 1:
        return image
    values = np.asarray(image, dtype=np.float32)

    def weights(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        where = np.clip((np.arange(size * factor) + 0.5) / factor - 0.5, 0, size - 1)
        low = np.floor(where).astype(int)
        return low, np.minimum(low + 1, size - 1), (where - low).astype(np.float32)

    top, bottom, wy = weights(values.shape[0])
    left, right, wx = weights(values.shape[1])
    rows = values[top] * (1 - wy)[:, None, None] + values[bottom] * wy[:, None, None]
    out = rows[:, left] * (1 - wx)[None, :, None] + rows[:, right] * wx[None, :, None]
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def _rows(frames: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(variant, its frames in order), the default first, the others in the table's order."""
    return [(name, frames[frames["variant"] == name].sort_values("frame")) for name in variants_in(frames)]


def _mosaic(images: list[np.ndarray], height: int, width: int) -> np.ndarray:
    """The images side by side with white gaps (a missing frame stays white)."""
    out = np.full((height, len(images) * (width + GAP) - GAP, 3), 255, dtype=np.uint8)
    for i, image in enumerate(images):
        if image is not None:
            out[:, i * (width + GAP) : i * (width + GAP) + width] = image[:height, :width]
    return out


def draw(tables: Mapping[str, pd.DataFrame], *, source: str, options: Mapping[str, Any], ax=None, **_: Any):
    kind = "contact_sheet"
    frames = table(tables, "frames", kind)
    one_checkpoint(frames, kind)
    runs = frames[["prompt_id", "seed"]].drop_duplicates()
    if len(runs) > 1:
        listed = ", ".join(f"{p} seed {s}" for p, s in runs.itertuples(index=False))
        raise ValueError(f"figure {kind} draws one prompt and seed; the table holds {listed}")
    prompt, seed = runs.iloc[0]
    unit = str(frames["unit"].iloc[0]) if "unit" in frames.columns else "video"
    base = int(option(options, "frame_base"))
    rows = _rows(frames)
    numbers = sorted({int(f) for f in frames["frame"]})
    height, width = (int(x) for x in np.asarray(frames["image"].iloc[0]).shape[:2])
    factor = math.ceil(SMOOTH_BELOW / height) if height < SMOOTH_BELOW else 1
    height, width = height * factor, width * factor
    # Frames a line: as many as fit the width at a readable height.
    frame_width = FRAME_HEIGHT * width / height
    lines = math.ceil(len(numbers) / max(1, min(len(numbers), int(WIDTH // frame_width))))
    per_line = math.ceil(len(numbers) / lines)  # the lines balanced
    line_width = min(len(numbers), per_line) * frame_width
    panel_height = FRAME_HEIGHT + 0.3
    fig = new_figure(max(5.0, line_width + 1.4), len(rows) * lines * panel_height + 0.6)
    grid = fig.add_gridspec(len(rows) * lines, 1)
    axes = []
    for r, (variant, chosen) in enumerate(rows):
        by_number = {
            int(f): enlarged(np.asarray(image, dtype=np.uint8), factor)
            for f, image in zip(chosen["frame"], chosen["image"])
        }
        for line in range(lines):
            shown = numbers[line * per_line : (line + 1) * per_line]
            axis = fig.add_subplot(grid[r * lines + line, 0])
            picture = _mosaic([by_number.get(n) for n in shown], height, width)
            image = axis.imshow(
                picture, interpolation="nearest", aspect="equal", extent=(0, picture.shape[1], picture.shape[0], 0)
            )
            image.set_gid(f"frames-{variant}-{line}")
            centres = [i * (width + GAP) + width / 2 for i in range(len(shown))]
            axis.set_xticks(centres, [str(n + base) for n in shown], fontsize=7)
            axis.set_yticks([])
            axis.set_xlim(0, per_line * (width + GAP) - GAP)
            axis.set_ylabel(
                variant if line == 0 else f"{variant} (cont.)", fontsize=8, rotation=0, ha="right", va="center"
            )
            axis.grid(False)
            for spine in axis.spines.values():
                spine.set_visible(False)
            axes.append(axis)
    axes[-1].set_xlabel("video frame" if unit == "video" else "latent frame")
    if unit == "video":
        shows = "decoded video (the checkpoint's Wan VAE), every 4th video frame"
        how = (
            "Every 4th video frame (0, 4, 8, ...: one per latent frame, the last video frame each latent frame "
            "decodes to), as the MP4 holds it."
        )
    else:
        preview = str(frames["preview"].iloc[0]) if "preview" in frames.columns else CHANNELS
        shows = "latents (no VAE) in a fixed projection to RGB"
        smooth = f", enlarged {factor}x with bilinear interpolation" if factor > 1 else ""
        how = (
            f"No VAE: each image is one latent frame, every latent pixel's channels projected to red, green and "
            f"blue by {preview_text(preview)}{smooth}. The same projection in every row, so a change of colour "
            "between rows is a change of the latents."
        )
    return finish(
        fig,
        title=f"Contact sheet: {prompt}, seed {seed}",
        subtitle=" · ".join([source, shows, f"{len(rows)} variant{'s' if len(rows) != 1 else ''}", runs_text(1)]),
        caption=f"{how} One row per variant, the untouched default on top; a long row wraps onto several lines.",
    )
