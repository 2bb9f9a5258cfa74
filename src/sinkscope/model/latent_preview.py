"""What latents look like without a VAE: a fixed linear projection of a model's latent
channels to RGB, the field's latent preview (docs/video.md, "Without a VAE").

Per latent pixel, with ``x`` the latent channels as the generator sees them (normalized):

    rgb = clip((x · factors + bias + 1) / 2, 0, 1)

``factors`` [channels, 3] and ``bias`` [3] are fixed per latent space, so a colour means
the same in every frame, row and run. The form, and the Wan numbers, are ComfyUI's latent
previews (``comfy/latent_formats.py``: ``Wan21`` and ``Wan22``, ``latent_rgb_factors`` and
``latent_rgb_factors_bias``; its ``latent_preview`` maps [-1, 1] to [0, 1] as here),
fitted there to the Wan VAEs' decoded colours.

The demo's latents are no VAE's (``sinkscope.demo.data`` draws them): a ball is a 16-d
appearance vector drawn per video from a standard normal, the background a 16-d offset
and textures drawn alike, so no direction of the 16 channels shows balls better than
another, with one exception: latent frame 0 (the image latent) carries a fixed offset,
``FIRST_FRAME_OFFSET``, 7.1 data standard deviations long, which would tint frame 0 and
nothing else. ``DEMO_FACTORS`` are channels 0, 1 and 2 with that direction projected out
(Gram-Schmidt, in that order: red is channel 0, green channel 1, blue mostly channel 2),
scaled so that 2.5 standard deviations of the data set (unit variance) either side of 0
span grey to black or full; ``demo_factors`` derives them, and a test checks the table
against it. A ball then shows as a blob of its appearance's colour over a grey, textured
background.

Latent widths without a table of their own (a custom model config) get ``channels``:
channels 0-2, each stretched over its 1st-99th percentile of a reference run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# ComfyUI's Wan21 latent preview (16 channels: Wan2.1's VAE, and Wan2.1-based models).
WAN21_FACTORS = (
    (-0.1299, -0.1692, 0.2932),
    (0.0671, 0.0406, 0.0442),
    (0.3568, 0.2548, 0.1747),
    (0.0372, 0.2344, 0.1420),
    (0.0313, 0.0189, -0.0328),
    (0.0296, -0.0956, -0.0665),
    (-0.3477, -0.4059, -0.2925),
    (0.0166, 0.1902, 0.1975),
    (-0.0412, 0.0267, -0.1364),
    (-0.1293, 0.0740, 0.1636),
    (0.0680, 0.3019, 0.1128),
    (0.0032, 0.0581, 0.0639),
    (-0.1251, 0.0927, 0.1699),
    (0.0060, -0.0633, 0.0005),
    (0.3477, 0.2275, 0.2950),
    (0.1984, 0.0913, 0.1861),
)
WAN21_BIAS = (-0.1835, -0.0868, -0.3360)

# ComfyUI's Wan22 latent preview (48 channels: Wan2.2's VAE, TI2V-5B and LongLive 2.0).
WAN22_FACTORS = (
    (0.0119, 0.0103, 0.0046),
    (-0.1062, -0.0504, 0.0165),
    (0.0140, 0.0409, 0.0491),
    (-0.0813, -0.0677, 0.0607),
    (0.0656, 0.0851, 0.0808),
    (0.0264, 0.0463, 0.0912),
    (0.0295, 0.0326, 0.0590),
    (-0.0244, -0.0270, 0.0025),
    (0.0443, -0.0102, 0.0288),
    (-0.0465, -0.0090, -0.0205),
    (0.0359, 0.0236, 0.0082),
    (-0.0776, 0.0854, 0.1048),
    (0.0564, 0.0264, 0.0561),
    (0.0006, 0.0594, 0.0418),
    (-0.0319, -0.0542, -0.0637),
    (-0.0268, 0.0024, 0.0260),
    (0.0539, 0.0265, 0.0358),
    (-0.0359, -0.0312, -0.0287),
    (-0.0285, -0.1032, -0.1237),
    (0.1041, 0.0537, 0.0622),
    (-0.0086, -0.0374, -0.0051),
    (0.0390, 0.0670, 0.2863),
    (0.0069, 0.0144, 0.0082),
    (0.0006, -0.0167, 0.0079),
    (0.0313, -0.0574, -0.0232),
    (-0.1454, -0.0902, -0.0481),
    (0.0714, 0.0827, 0.0447),
    (-0.0304, -0.0574, -0.0196),
    (0.0401, 0.0384, 0.0204),
    (-0.0758, -0.0297, -0.0014),
    (0.0568, 0.1307, 0.1372),
    (-0.0055, -0.0310, -0.0380),
    (0.0239, -0.0305, 0.0325),
    (-0.0663, -0.0673, -0.0140),
    (-0.0416, -0.0047, -0.0023),
    (0.0166, 0.0112, -0.0093),
    (-0.0211, 0.0011, 0.0331),
    (0.1833, 0.1466, 0.2250),
    (-0.0368, 0.0370, 0.0295),
    (-0.3441, -0.3543, -0.2008),
    (-0.0479, -0.0489, -0.0420),
    (-0.0660, -0.0153, 0.0800),
    (-0.0101, 0.0068, 0.0156),
    (-0.0690, -0.0452, -0.0927),
    (-0.0145, 0.0041, 0.0015),
    (0.0421, 0.0451, 0.0373),
    (0.0504, -0.0483, -0.0356),
    (-0.0837, 0.0168, 0.0055),
)
WAN22_BIAS = (0.0317, -0.0878, -0.1388)

# The demo's (above): demo_factors(sinkscope.demo.data.FIRST_FRAME_OFFSET), to 4 decimals.
DEMO_RANGE = 2.5  # data standard deviations from grey to black or to full
DEMO_FACTORS = (
    (0.3957, 0.0000, 0.0000),
    (-0.0046, 0.3987, 0.0000),
    (0.0321, 0.0176, 0.3330),
    (0.0308, 0.0169, -0.1414),
    (0.0024, 0.0013, -0.0111),
    (-0.0037, -0.0020, 0.0171),
    (-0.0090, -0.0049, 0.0411),
    (0.0148, 0.0081, -0.0679),
    (-0.0212, -0.0116, 0.0970),
    (-0.0117, -0.0064, 0.0536),
    (-0.0174, -0.0096, 0.0799),
    (0.0087, 0.0048, -0.0397),
    (-0.0057, -0.0032, 0.0263),
    (-0.0064, -0.0035, 0.0296),
    (-0.0012, -0.0007, 0.0055),
    (0.0050, 0.0028, -0.0231),
)
DEMO_BIAS = (0.0, 0.0, 0.0)

# name: (factors, bias, what the caption says it is)
PREVIEWS = {
    "wan2.1": (WAN21_FACTORS, WAN21_BIAS, "Wan2.1's latent-to-RGB factors (ComfyUI's Wan21 preview)"),
    "wan2.2": (WAN22_FACTORS, WAN22_BIAS, "Wan2.2's latent-to-RGB factors (ComfyUI's Wan22 preview)"),
    "demo": (
        DEMO_FACTORS,
        DEMO_BIAS,
        "the demo's fixed projection: channels 0-2 as red, green and blue without the image latent's "
        f"offset direction, {DEMO_RANGE:g} data standard deviations either side of 0 from grey to black or full",
    ),
}
CHANNELS = "channels"  # no table: channels 0-2, each stretched over a reference run's percentiles
CHANNEL_PERCENTILES = (1.0, 99.0)


def demo_factors(first_frame_offset: Sequence[float], scale: float = DEMO_RANGE) -> np.ndarray:
    """[C, 3]: channels 0, 1, 2 with the direction of ``first_frame_offset`` projected out,
    orthonormalized in that order (Gram-Schmidt), divided by ``scale``."""
    offset = np.asarray(first_frame_offset, dtype=np.float64)
    offset = offset / np.linalg.norm(offset)
    rows: list[np.ndarray] = []
    for channel in range(3):
        row = np.eye(len(offset))[channel]
        for direction in (offset, *rows):
            row = row - direction * (direction @ row)
        rows.append(row / np.linalg.norm(row))
    return np.stack(rows, axis=1) / scale


def preview_text(name: str) -> str:
    """What the projection ``name`` is, in the caption's words."""
    if name == CHANNELS:
        return (
            "channels 0-2 as red, green and blue, each mapped linearly from its 1st-99th percentile over the "
            "default run's frames to 0-255 (values outside clipped)"
        )
    return PREVIEWS[name][2]


def preview_rgb(latents: np.ndarray, name: str, reference: np.ndarray | None = None) -> np.ndarray:
    """Latents [C, F, H, W] -> uint8 RGB frames [F, H, W, 3] by the projection ``name``
    (``PREVIEWS``, or ``CHANNELS``, which stretches each channel over ``reference``'s
    1st-99th percentile: the same mapping for every run given the same reference)."""
    values = np.asarray(latents, dtype=np.float32)
    if name == CHANNELS:
        first = np.asarray(values if reference is None else reference, dtype=np.float32)
        channels = [min(c, first.shape[0] - 1) for c in range(3)]
        low, high = (np.percentile(first[channels].reshape(3, -1), q, axis=1) for q in CHANNEL_PERCENTILES)
        span = np.where(high > low, high - low, 1.0)
        unit = (values[channels] - low[:, None, None, None]) / span[:, None, None, None]
        return _bytes(np.moveaxis(unit, 0, -1))
    if name not in PREVIEWS:
        raise ValueError(f"no latent preview {name!r}; known: {', '.join([*PREVIEWS, CHANNELS])}")
    factors, bias, _ = PREVIEWS[name]
    factors = np.asarray(factors, dtype=np.float32)
    if values.shape[0] != factors.shape[0]:
        raise ValueError(
            f"latent preview {name!r} is for {factors.shape[0]} channels, the latents have {values.shape[0]}"
        )
    rgb = np.einsum("cfhw,ck->fhwk", values, factors) + np.asarray(bias, dtype=np.float32)
    return _bytes((rgb + 1.0) / 2.0)


def _bytes(unit: np.ndarray) -> np.ndarray:
    """[0, 1] values -> uint8, rounded to nearest, clipped."""
    return np.ascontiguousarray(np.clip(np.round(unit * 255.0), 0, 255).astype(np.uint8))
