"""Long-rollout diagnostics beside the attention: does the video snap back to its sink?

LoL (arXiv 2601.16914) reports "sink collapse" in long rollouts: content returning to
the sink frame at fixed latent indices, tied to RoPE periodicity. Per block, the
extraction job records (numpy only, from the generated latents):

- ``latent_sink_cosine``: the mean cosine similarity between each of the block's frames
  and each sink frame (the policy's first S frames; frame 0 without a sink), frames
  flattened over channels and the patch grid; null for the block holding them;
- ``latent_previous_cosine``: the same between the block's frames and the previous
  block's; null for block 0;
- ``rope_periods``: the temporal RoPE channels whose period ends inside the block's
  frames (``rope_period_ends``), e.g. ``"c7@117.7"``: channel pair 7 completes a turn
  at frame 117.7.

Wan's temporal RoPE uses the first ``head_dim - 4 (head_dim // 6)`` channels of each
head, in pairs j with angle ``position * theta**(-2j / axis_t)``: pair j completes a
turn every ``2 pi theta**(2j / axis_t)`` frames (6.3, 9.5, 14.5, 22.1, 33.5, 51.0, 77.5,
117.7, 178.9, 272.0, ... for Wan2.1-1.3B's head_dim 128). LoL places the collapse of
LongLive and Self-Forcing++ at latent frames 132 and 201; these marks let a study see
whether its own returns line up with a channel's turn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def rope_periods(head_dim: int, theta: float = 10000.0) -> list[float]:
    """Frames per full turn of each temporal RoPE channel pair, fastest first."""
    axis_t = head_dim - 4 * (head_dim // 6)
    return [2 * math.pi * theta ** (2 * j / axis_t) for j in range(axis_t // 2)]


def rope_period_ends(head_dim: int, start: int, stop: int, theta: float = 10000.0) -> str:
    """The channel pairs whose turns end at a position in [start, stop), as
    ``"c<j>@<position>"`` joined by spaces; pairs turning more than once per frame or
    every few frames (period < 16 frames) are left out: they end a turn in every block."""
    ends = []
    for pair, period in enumerate(rope_periods(head_dim, theta)):
        if period < 16:
            continue
        turn = math.ceil(start / period) * period
        if turn == 0:
            turn = period
        while turn < stop:
            ends.append(f"c{pair}@{turn:.1f}")
            turn += period
    return " ".join(ends)


def _unit_rows(latents: np.ndarray) -> np.ndarray:
    """[F, C*H*W] frames of a [C, F, H, W] latent video, each scaled to unit length."""
    frames = np.moveaxis(np.asarray(latents, dtype=np.float64), 1, 0).reshape(latents.shape[1], -1)
    norms = np.linalg.norm(frames, axis=1, keepdims=True)
    return frames / np.where(norms > 0, norms, 1.0)


def block_similarity(
    latents: np.ndarray, block_sizes: Sequence[int], sink_frames: int, head_dim: int | None = None
) -> dict[str, list]:
    """Per block of a [C, F, H, W] latent video: ``block``, ``latent_sink_cosine``,
    ``latent_previous_cosine`` (None where undefined) and ``rope_periods`` (with the
    model's ``head_dim``; empty strings without it)."""
    unit = _unit_rows(latents)
    cosine = unit @ unit.T
    sinks = range(max(int(sink_frames), 1))
    out: dict[str, list] = {"block": [], "latent_sink_cosine": [], "latent_previous_cosine": [], "rope_periods": []}
    start, previous = 0, None
    for block, size in enumerate(block_sizes):
        frames = range(start, start + size)
        outside = [s for s in sinks if s < start]
        out["block"].append(block)
        out["latent_sink_cosine"].append(float(cosine[np.ix_(frames, outside)].mean()) if outside else None)
        out["latent_previous_cosine"].append(float(cosine[np.ix_(frames, previous)].mean()) if previous else None)
        out["rope_periods"].append(rope_period_ends(head_dim, start, start + size) if head_dim else "")
        start, previous = start + size, frames
    return out
