"""A seeded synthetic video data set in the demo model's latent space.

The trained demo (``sinkscope.demo.train``) learns from videos drawn here. They are made
directly as latents (16 channels x 21 frames x 8 x 12, the ``demo`` config's grid;
7 blocks of 3 frames), with no VAE: soft Gaussian "balls" move over a static,
smooth background. Every video draws its own

- appearance: a 16-d vector per ball (the ball's "colour" in latent space), constant
  over the video, so that keeping a ball's identity over time pays;
- background: a constant 16-d offset plus a smooth static texture;
- motion parameters: position, speed, phase, size, within its class.

Five motion classes, each with one fixed prompt (``CLASS_PROMPTS``); a prompt names
the class and nothing else, so the rest (appearance, phase, position) is the
sampler's to choose:

============  ==================================  =============================================
class         prompt                              motion
============  ==================================  =============================================
``drift``     a ball drifting left to right       constant speed across the frame, ~0.4 px/frame
``bounce``    a ball bouncing up and down         |sin| bounce off the floor, period 8 frames
``circle``    a ball moving in a circle           counter-clockwise circle, period 6 frames
``pulse``     a glowing ball pulsing in place     fixed position, brightness period 6 frames
``cross``     two balls crossing paths            two balls, one each way, crossing mid-video
============  ==================================  =============================================

**The first frame is an image latent** (data version 2), as in Wan2.1's causal VAE,
which encodes the first video frame alone and every later group of 4 video frames
into one latent frame (81 video frames -> 1 + 20 latent frames):

- latent frame 0 is a single instant (t = 0), sharp; latent frame k >= 1 is the mean
  of the 4 instants k - 3/4, k - 1/2, k - 1/4, k (``TEMPORAL_COMPRESSION``): a moving
  ball is motion-blurred there, a pulse's brightness averaged;
- latent frame 0 has channel statistics of its own: a fixed per-channel gain and
  offset (``FIRST_FRAME_GAIN``, ``FIRST_FRAME_OFFSET``), the same for every video,
  which the later frames do not have.

``first_frame="video"``, ``temporal_compression=1`` and ``scale=VERSION1_SCALE``
(``options_of(None)``) give back version 1's videos exactly (every frame one instant,
no first-frame statistics); the periodic demo, ``demo_periodic.pt``, was trained on
those. The default demo, ``demo_trained.pt``, was trained on version 2 with
``fine_texture=0.5`` and has a first-frame sink (docs/trained-demo.md, run M).

Values are divided by ``DATA_SCALE`` so that the whole data set has about unit
variance, as VAE latents scaled for a diffusion model have. Everything random comes
from one CPU generator seeded by the caller, so a seed gives the same videos on any
device (they are rendered on the requested device); only the optional ``grain`` of
the experiments is drawn on the device.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

# The demo config's latent grid and Self-Forcing's video length.
CHANNELS = 16
FRAMES = 21
HEIGHT = 8
WIDTH = 12

DATA_VERSION = 2

CLASS_PROMPTS: dict[str, str] = {
    "drift": "a ball drifting left to right",
    "bounce": "a ball bouncing up and down",
    "circle": "a ball moving in a circle",
    "pulse": "a glowing ball pulsing in place",
    "cross": "two balls crossing paths",
}
CLASSES: tuple[str, ...] = tuple(CLASS_PROMPTS)

# Periods, in latent frames, of the periodic classes.
BOUNCE_PERIOD = 8.0
CIRCLE_PERIOD = 6.0
PULSE_PERIOD = 6.0

# Wan2.1's VAE: one latent frame for the first video frame, one for each later 4.
TEMPORAL_COMPRESSION = 4
FIRST_FRAME_STYLES = ("image", "video")
# The image latent's own channel statistics (raw units, before DATA_SCALE): latent frame
# 0 is FIRST_FRAME_GAIN * x + FIRST_FRAME_OFFSET per channel. Fixed numbers, drawn once
# and written out (``first_frame_statistics(81)``, rounded to 2 decimals): gain
# exp(0.25 z1), offset z2, z1 and z2 standard normal 16-vectors.
FIRST_FRAME_GAIN = (0.56, 0.67, 1.03, 0.96, 0.61, 0.83, 0.74, 1.3, 1.6, 1.17, 1.21, 1.09, 0.88, 1.1, 1.66, 0.96)
FIRST_FRAME_OFFSET = (
    -0.85,
    -0.46,
    3.19,
    3.06,
    0.24,
    -0.37,
    -0.89,
    1.47,
    -2.1,
    -1.16,
    -1.73,
    0.86,
    -0.57,
    -0.64,
    -0.12,
    0.5,
)

# Raw amplitudes, before the division by DATA_SCALE.
BALL_AMPLITUDE = 2.0  # per channel, times a standard normal appearance vector
BACKGROUND_AMPLITUDE = 0.5  # the constant 16-d offset
TEXTURE_AMPLITUDE = 0.35  # the smooth static texture
# The raw data's standard deviation over the whole data set (all classes equally
# likely, the first frame an image latent), measured once over 4096 videos
# (``synthetic_batch(12345, 4096, scale=1.0).latents.double().std()``); dividing by it
# gives unit variance. Every frame but the first then has a standard deviation of 0.92,
# the image latent 2.0 (its offset). Version 1 (``first_frame="video"``,
# ``temporal_compression=1``) measured 0.764 (``VERSION1_SCALE``; ``options_of`` passes
# it for version 1 checkpoints).
DATA_SCALE = 0.827
VERSION1_SCALE = 0.764

_NUM_UNIFORMS = 8  # uniform draws per video, shared by the classes' parameter formulas


class SyntheticBatch(NamedTuple):
    """A batch of videos: unpacks as ``latents, labels, prompts``."""

    latents: torch.Tensor  # [B, 16, 21, 8, 12]
    labels: torch.Tensor  # [B] int64 class ids (indices into CLASSES)
    prompts: list[str]  # [B] the class prompts


def class_index(name: str) -> int:
    try:
        return CLASSES.index(name)
    except ValueError:
        raise KeyError(f"unknown class {name!r}; known: {', '.join(CLASSES)}") from None


def describe(
    first_frame: str = "image", temporal_compression: int = TEMPORAL_COMPRESSION, grain: float = 0.0, **extra: float
) -> dict:
    """The data set's definition, JSON-ready (stored in training checkpoints)."""
    return {
        "name": "sinkscope.demo.data",
        "version": DATA_VERSION,
        "shape": [CHANNELS, FRAMES, HEIGHT, WIDTH],
        "classes": list(CLASSES),
        "prompts": dict(CLASS_PROMPTS),
        "periods": {"bounce": BOUNCE_PERIOD, "circle": CIRCLE_PERIOD, "pulse": PULSE_PERIOD},
        "scale": DATA_SCALE,
        "first_frame": first_frame,
        "temporal_compression": int(temporal_compression),
        "grain": float(grain),
        **{k: float(v) for k, v in extra.items()},
        "first_frame_gain": list(FIRST_FRAME_GAIN) if first_frame == "image" else None,
        "first_frame_offset": list(FIRST_FRAME_OFFSET) if first_frame == "image" else None,
    }


def options_of(description: dict | None) -> dict:
    """``synthetic_batch`` keyword arguments for the data a checkpoint was trained on,
    from its ``describe()`` record (None or version 1: version 1's videos)."""
    if not description or int(description.get("version", 1)) < 2:
        return {"first_frame": "video", "temporal_compression": 1, "scale": VERSION1_SCALE}
    return {
        "scale": float(description.get("scale", DATA_SCALE)),
        "first_frame": description.get("first_frame", "image"),
        "temporal_compression": int(description.get("temporal_compression", TEMPORAL_COMPRESSION)),
        "grain": float(description.get("grain") or 0.0),
        **{
            k: float(description[k])
            for k in ("fine_texture", "image_offset", "image_gain", "pan", "shake")
            if description.get(k) is not None
        },
    }


def first_frame_statistics(seed: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """How FIRST_FRAME_GAIN and FIRST_FRAME_OFFSET were drawn (with seed 81)."""
    z = torch.randn(2, CHANNELS, generator=torch.Generator().manual_seed(int(seed)))
    gain = tuple(round(float(v), 2) for v in torch.exp(0.25 * z[0]))
    offset = tuple(round(float(v), 2) for v in z[1])
    return gain, offset


def instants(frames: int, temporal_compression: int = TEMPORAL_COMPRESSION) -> torch.Tensor:
    """[1 + c (frames - 1)] the times (in latent frames) of the video frames behind the
    latents: 0, then c per later latent frame, the last of them at the frame's index."""
    c = int(temporal_compression)
    later = torch.arange(1, c * max(frames - 1, 0) + 1, dtype=torch.float32) / c
    return torch.cat([torch.zeros(1), later])


def _trajectories(
    labels: torch.Tensor, u: torch.Tensor, times: torch.Tensor, frames: int, height: int, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, y, brightness of two balls, each [B, 2, T] at ``times`` [T] (latent frames);
    ball 2 is dark except in ``cross``.

    ``u`` [B, _NUM_UNIFORMS] uniforms in [0, 1); coordinates are in latent pixels,
    scaled from the 8 x 12 grid the formulas were written for.
    """
    f = times.to(torch.float32)[None, :]
    sx, sy = width / 12.0, height / 8.0
    span = max(frames - 1, 1)
    b = labels.shape[0]
    steps = f.shape[1]
    x = torch.zeros(b, 2, steps)
    y = torch.zeros(b, 2, steps)
    bright = torch.zeros(b, 2, steps)
    u0, u1, u2, u3 = (u[:, i : i + 1] for i in range(4))

    # drift: left to right at constant speed.
    start, end = 0.8 + 1.5 * u0, 8.7 + 1.5 * u1
    drift_x = start + (end - start) * f / span
    drift_y = 2.0 + 3.5 * u2 + 0.0 * f
    # bounce: |sin| hop off the floor (y = 6.2), height 3.5..4.5, random phase and column.
    phase = u0
    hop = (3.5 + 1.0 * u1) * torch.abs(torch.sin(math.pi * (f / BOUNCE_PERIOD + phase)))
    bounce_x = 2.5 + 6.0 * u2 + 0.0 * f
    bounce_y = 6.2 - hop
    # circle: counter-clockwise (x right, y down: the angle decreases), period 6 frames.
    angle = -2 * math.pi * (f / CIRCLE_PERIOD + u0)
    radius = 2.0 + 0.6 * u1
    circle_x = 4.5 + 2.0 * u2 + radius * torch.cos(angle)
    circle_y = 3.5 + radius * 0.9 * torch.sin(angle)
    # pulse: fixed place, brightness 0.15..1 with period 6 frames.
    pulse_x = 2.5 + 6.0 * u0 + 0.0 * f
    pulse_y = 2.0 + 3.5 * u1 + 0.0 * f
    pulse_b = 0.575 + 0.425 * torch.cos(2 * math.pi * (f / PULSE_PERIOD + u2))
    # cross: ball 1 left to right, ball 2 right to left, crossing near the middle frame.
    cross_a = 0.8 + 1.2 * u0 + (8.2 + 1.2 * u1 - 0.8 - 1.2 * u0) * f / span
    cross_b = 10.2 - 1.2 * u1 - (8.2 + 1.2 * u0 - 0.8 - 1.2 * u1) * f / span
    cross_ya = 2.0 + 3.5 * u2 + 0.0 * f
    cross_yb = 2.0 + 3.5 * u3 + 0.0 * f

    ones = torch.ones_like(f.expand(b, -1))
    table = {
        "drift": ((drift_x, drift_y, ones), None),
        "bounce": ((bounce_x, bounce_y, ones), None),
        "circle": ((circle_x, circle_y, ones), None),
        "pulse": ((pulse_x, pulse_y, pulse_b.expand(b, -1)), None),
        "cross": ((cross_a, cross_ya, ones), (cross_b, cross_yb, ones)),
    }
    for name, (first, second) in table.items():
        rows = labels == class_index(name)
        if not rows.any():
            continue
        for ball, values in enumerate((first, second)):
            if values is None:
                continue
            bx, by, bb = (v.expand(b, -1)[rows] for v in values)
            x[rows, ball] = bx * sx
            y[rows, ball] = by * sy
            bright[rows, ball] = bb
    return x, y, bright


def synthetic_batch(
    seed: int,
    batch_size: int,
    *,
    classes: int | str | list[int] | torch.Tensor | None = None,
    frames: int = FRAMES,
    height: int = HEIGHT,
    width: int = WIDTH,
    channels: int = CHANNELS,
    first_frame: str = "image",
    temporal_compression: int = TEMPORAL_COMPRESSION,
    grain: float = 0.0,
    fine_texture: float = 0.0,
    image_offset: float = 1.0,
    image_gain: float = 1.0,
    pan: float = 0.0,
    shake: float = 0.0,
    scale: float = DATA_SCALE,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> SyntheticBatch:
    """``batch_size`` videos from ``seed``: (latents [B, 16, 21, 8, 12], class ids, prompts).

    ``classes``: None draws each video's class uniformly; a class name or id gives
    every video that class; a list/tensor gives each video's class. The same seed and
    arguments give the same batch, on any device. ``first_frame``: "image" (latent
    frame 0 an image latent with its own channel statistics) or "video" (like the
    others); ``temporal_compression``: video frames a later latent frame averages.
    ``grain`` (raw units, default 0: none): independent per-pixel detail of every video
    frame (standard deviation ``grain``), so a latent frame that averages c video frames
    has grain / sqrt(c); it is drawn on ``device`` by a generator of its own, so it
    differs between devices (everything else does not). ``fine_texture`` (raw, default
    0): a static per-pixel background texture of that standard deviation.
    ``image_offset`` and ``image_gain`` multiply FIRST_FRAME_OFFSET and FIRST_FRAME_GAIN
    (experiments; 1 is the data set). ``pan`` (latent pixels per latent frame, default
    0): a camera pan; the background (smooth and fine texture) moves that fast in a
    direction drawn per video, seen through a window of a larger canvas and sampled at
    each video instant, so a later latent frame blurs it as it blurs a ball. Then no
    pixel of the background stays where it was, as in most real videos. ``shake`` (latent
    pixels, default 0): a hand-held camera; every video instant after the first is
    displaced from the first instant's pose by its own N(0, shake^2) per axis (clamped at
    3 shake), background and balls alike, so a later latent frame, which averages 4
    instants, blurs the static detail that the image latent (one instant, at the reference
    pose) keeps sharp. ``scale``: the raw values are divided by it.
    """
    if first_frame not in FIRST_FRAME_STYLES:
        raise ValueError(f"first_frame {first_frame!r} is not one of {', '.join(FIRST_FRAME_STYLES)}")
    if first_frame == "image" and channels != len(FIRST_FRAME_OFFSET):
        raise ValueError(f"an image first frame has {len(FIRST_FRAME_OFFSET)} channels' statistics, not {channels}")
    if int(temporal_compression) < 1:
        raise ValueError("temporal_compression must be at least 1")
    generator = torch.Generator().manual_seed(int(seed))
    # Draws in a fixed order, whatever the classes, so a video's look does not
    # depend on the class mix of its batch.
    drawn_labels = torch.randint(len(CLASSES), (batch_size,), generator=generator)
    u = torch.rand(batch_size, _NUM_UNIFORMS, generator=generator)
    appearance = torch.randn(batch_size, 2, channels, generator=generator)
    background = torch.randn(batch_size, channels, generator=generator)
    texture = torch.randn(batch_size, channels, max(height // 2, 1), max(width // 2, 1), generator=generator)
    fine = torch.randn(batch_size, channels, height, width, generator=generator) if fine_texture > 0 else None
    times = instants(frames, temporal_compression)
    camera_moves = pan > 0 or shake > 0
    if camera_moves:  # drawn after everything else, so pan = shake = 0 leaves every other draw as it was
        margin = math.ceil(pan * (frames - 1) + 3 * shake) + 1
        canvas = (height + 2 * margin, width + 2 * margin)
        pan_angle = 2 * math.pi * torch.rand(batch_size, generator=generator)
        pan_fine = torch.randn(batch_size, channels, *canvas, generator=generator) if fine_texture > 0 else None
        # [B, (y, x), T] the camera's displacement from its first pose at each video instant.
        camera = torch.zeros(batch_size, 2, len(times))
        if shake > 0:
            camera[:, :, 1:] = (shake * torch.randn(batch_size, 2, len(times) - 1, generator=generator)).clamp(
                -3 * shake, 3 * shake
            )
        shaking = camera  # the balls move with the shake, not with a pan
        if pan > 0:
            velocity = pan * torch.stack(
                [torch.sin(pan_angle), torch.cos(pan_angle)], dim=1
            )  # [B, (y, x)] px / latent frame
            camera = camera + velocity[:, :, None] * times

    if classes is None:
        labels = drawn_labels
    elif isinstance(classes, str):
        labels = torch.full((batch_size,), class_index(classes), dtype=torch.long)
    elif isinstance(classes, int):
        labels = torch.full((batch_size,), int(classes), dtype=torch.long)
    else:
        labels = torch.as_tensor(classes, dtype=torch.long).reshape(-1)
        if labels.numel() != batch_size:
            raise ValueError(f"{labels.numel()} classes given for a batch of {batch_size}")
    if labels.numel() and not (0 <= int(labels.min()) and int(labels.max()) < len(CLASSES)):
        raise ValueError(f"class ids must be in [0, {len(CLASSES)})")

    x, y, bright = _trajectories(labels, u, times, frames, height, width)
    if shake > 0:  # the scene seen from the shaking camera (a pan moves the background only)
        x, y = x - shaking[:, None, 1], y - shaking[:, None, 0]
    # Ball size (Gaussian sigma, latent pixels), 1.2 .. 1.6, one per video.
    sigma = (1.2 + 0.4 * u[:, 4]) * min(height / 8.0, width / 12.0)
    # Latent frame k >= 1 averages its video frames (motion blur); frame 0 is one instant.
    c = int(temporal_compression)
    pool = torch.zeros(frames, len(times))
    pool[0, 0] = 1.0
    for k in range(1, frames):
        pool[k, 1 + c * (k - 1) : 1 + c * k] = 1.0 / c

    device = torch.device(device)
    if device.type == "cuda":
        # Pinned, asynchronous copies: no host synchronisation per batch.
        def move(t: torch.Tensor) -> torch.Tensor:
            return t.pin_memory().to(device, non_blocking=True)
    else:

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device)

    x, y, bright, sigma, appearance, background, texture, labels_out, pool = (
        move(t) for t in (x, y, bright, sigma, appearance, background, texture, labels, pool)
    )
    hh = torch.arange(height, dtype=torch.float32, device=device)
    ww = torch.arange(width, dtype=torch.float32, device=device)
    two_s2 = (2 * sigma**2)[:, None, None, None, None]
    dy = (hh[None, None, None, :, None] - y[..., None, None]) ** 2
    dx = (ww[None, None, None, None, :] - x[..., None, None]) ** 2
    blobs = torch.exp(-(dy + dx) / two_s2) * bright[..., None, None]  # [B, 2, T, H, W] at every instant
    blobs = torch.einsum("bsthw,ft->bsfhw", blobs, pool)  # [B, 2, F, H, W] per latent frame
    video = torch.einsum("bsfhw,bsc->bcfhw", blobs, BALL_AMPLITUDE * appearance)
    video = video + (BACKGROUND_AMPLITUDE * background)[:, :, None, None, None]
    if camera_moves:
        plane = TEXTURE_AMPLITUDE * F.interpolate(texture, size=canvas, mode="bilinear", align_corners=False)
        if pan_fine is not None:
            plane = plane + fine_texture * move(pan_fine)
        moving = _camera_window(plane, move(camera), margin, height, width)  # [B, C, T, H, W]
        video = video + torch.einsum("bcthw,ft->bcfhw", moving, pool)
    else:
        smooth = F.interpolate(texture, size=(height, width), mode="bilinear", align_corners=False)
        video = video + TEXTURE_AMPLITUDE * smooth[:, :, None]
        if fine is not None:
            video = video + fine_texture * move(fine)[:, :, None]
    if grain > 0:
        noise_gen = torch.Generator(device=device).manual_seed((int(seed) ^ 0x6772616E) & ((1 << 63) - 1))
        detail = torch.randn(video.shape, generator=noise_gen, device=device)
        per_frame = torch.full((frames,), grain / c**0.5, device=device)
        per_frame[0] = grain
        video = video + detail * per_frame[None, None, :, None, None]
    if first_frame == "image":
        gain = image_gain * torch.tensor(FIRST_FRAME_GAIN, device=device)[None, :, None, None]
        offset = image_offset * torch.tensor(FIRST_FRAME_OFFSET, device=device)[None, :, None, None]
        video = torch.cat([(gain * video[:, :, 0] + offset)[:, :, None], video[:, :, 1:]], dim=2)
    latents = (video / scale).to(dtype)
    prompts = [CLASS_PROMPTS[CLASSES[int(i)]] for i in labels]
    return SyntheticBatch(latents, labels_out, prompts)


def _camera_window(plane: torch.Tensor, shift: torch.Tensor, margin: int, height: int, width: int) -> torch.Tensor:
    """[B, C, T, H, W]: the height x width window of ``plane`` [B, C, H + 2m, W + 2m] whose
    top-left corner is at (m, m) + ``shift`` [B, 2 (y, x), T] at each of T instants;
    bilinear between canvas pixels."""
    batch, channels = plane.shape[:2]
    rows = margin + shift[:, 0, :, None] + torch.arange(height, device=plane.device)  # [B, T, H]
    cols = margin + shift[:, 1, :, None] + torch.arange(width, device=plane.device)  # [B, T, W]
    r0, c0 = rows.floor(), cols.floor()
    fr, fc = rows - r0, cols - c0
    r0, c0 = r0.long(), c0.long()
    flat = plane.flatten(2)  # [B, C, canvas pixels]
    canvas_width = plane.shape[-1]
    out = 0
    for dr, wr in ((0, 1 - fr), (1, fr)):
        for dc, wc in ((0, 1 - fc), (1, fc)):
            index = ((r0 + dr)[:, :, :, None] * canvas_width + (c0 + dc)[:, :, None, :]).flatten(1)  # [B, T*H*W]
            values = flat.gather(2, index[:, None, :].expand(batch, channels, -1))
            weight = (wr[:, :, :, None] * wc[:, :, None, :]).flatten(1)[:, None, :]
            out = out + values * weight
    return out.view(batch, channels, shift.shape[-1], height, width)
