"""The video job (``outputs.video``): a run's final latents decoded by the checkpoint's Wan
VAE into an MP4, and the MP4 files read and written.

``decode_video_job``: ``latents.safetensors`` of the run's extraction folder -> the Wan
VAE on the job's device (``sinkscope.model.vae``; latent frame 0 alone, then as many
latent frames a call as the memory budget allows) -> uint8 frames -> an H.264 MP4
(``write_mp4``: PyAV, yuv420p) at the model's frame rate. The contact sheets drawn from
the videos: ``sinkscope.pipeline.contact_sheets``; which runs get a video and where it
goes: ``sinkscope.pipeline.videoplan``.

PyAV (``av``), torch and diffusers are imported inside the functions that need them.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from sinkscope.errors import SinkscopeError
from sinkscope.io import atomic_path
from sinkscope.pipeline.latents import read_latents

log = logging.getLogger("sinkscope")


# -- MP4 files -------------------------------------------------------------------------------------


def write_mp4(frames: np.ndarray, path: str | Path, fps: int, *, crf: int = 18) -> None:
    """uint8 frames [T, H, W, 3] -> an H.264 MP4 (yuv420p, constant rate ``fps``), atomically.
    H.264 in yuv420p needs an even width and height (every Wan video's are)."""
    import av

    frames = np.ascontiguousarray(frames, dtype=np.uint8)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames are uint8 [T, H, W, 3]; got shape {list(frames.shape)}")
    height, width = frames.shape[1:3]
    if height % 2 or width % 2:
        raise ValueError(f"an H.264 video needs an even width and height; got {width}x{height}")
    with atomic_path(path) as tmp:
        with av.open(str(tmp), mode="w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=int(fps))
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            stream.options = {"crf": str(crf), "preset": "medium"}
            for image in frames:
                for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)


def read_mp4(path: str | Path, every: int = 1) -> np.ndarray:
    """The frames of an MP4 as uint8 [T, H, W, 3] (every ``every``-th frame, from frame 0)."""
    import av

    try:
        with av.open(str(path)) as container:
            frames = [
                frame.to_ndarray(format="rgb24") for i, frame in enumerate(container.decode(video=0)) if i % every == 0
            ]
    except (av.error.FFmpegError, OSError) as exc:
        raise SinkscopeError(f"{path}: not a readable video ({str(exc).splitlines()[0][:160]})") from None
    if not frames:
        raise SinkscopeError(f"{path}: the video holds no frames")
    return np.stack(frames)


def mp4_info(path: str | Path) -> dict[str, Any]:
    """Frames, width, height and frame rate of an MP4 (counted by decoding it)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        count = sum(1 for _ in container.decode(stream))
        return {
            "frames": count,
            "width": stream.codec_context.width,
            "height": stream.codec_context.height,
            "fps": float(stream.average_rate),
        }


# -- decoding a run ---------------------------------------------------------------------------------


def decode_video_job(
    *,
    extraction: str | Path,
    output: str | Path,
    vae: str | Path,
    fps: int,
    device: str = "auto",
    memory_budget_gib: float | None = None,
) -> None:
    """Decode the final latents of one run (its extraction folder) into ``output`` (MP4)."""
    import torch

    from sinkscope.model.vae import load_vae
    from sinkscope.pipeline.jobs import pick_device

    began = time.perf_counter()
    latents = read_latents(extraction)
    where = pick_device(device)
    model = load_vae(vae, device=str(where))
    if memory_budget_gib is not None:
        budget = int(memory_budget_gib * 2**30)
    elif where.type == "cuda":
        free, _ = torch.cuda.mem_get_info(where)
        budget = int(free * 0.5)  # the rest: the cache, the allocator's slack
    else:
        budget = 2**30
    per_call = model.frames_per_call(latents.shape, budget)
    frames = model.decode(latents, frames_per_call=per_call).numpy()
    write_mp4(frames, output, fps)
    log.info(
        "decoded %d latent frames to %d video frames %dx%d (%d latent frames a call) on %s in %.2f s",
        latents.shape[1],
        len(frames),
        frames.shape[2],
        frames.shape[1],
        per_call,
        where,
        time.perf_counter() - began,
    )
