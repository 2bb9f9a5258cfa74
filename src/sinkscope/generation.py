"""Self-Forcing's block-causal video generation with a KV cache.

The procedure (Self-Forcing ``CausalInferencePipeline.inference``, T2V):

- the video's latent frames are generated block by block (3 frames a block, or
  [1, 3, 3, ...] with an independent first frame);
- per block, a few-step flow-matching sampler: the model predicts the velocity at
  timestep t, x0 = x_t - sigma_t v (float64), and, unless it was the last step, x0 is
  re-noised with fresh noise to the next timestep;
- the finished block is run once more at the context timestep (0) so that its
  clean keys/values overwrite its slots in the KV cache (the "cache pass").

Timesteps come from a shifted flow-matching schedule (shift 5): the denoising list
[1000, 750, 500, 250] "warped" through it gives t = 1000, 937.5, 833.3, 625.
All noise is drawn up front from one seeded CPU generator, so a seed gives the same
video on any device.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .model import WanModel
from .options import GenerationOptions

PASS_DENOISE = "denoise"
PASS_CACHE = "cache"


class FlowMatchSchedule:
    """Shifted flow matching, sigma_min 0, one extra step (Self-Forcing's FlowMatchScheduler).

    sigma_i = linspace(1, 0, T+1)[:-1], shifted s sigma / (1 + (s-1) sigma); t = T sigma.
    Lookups take the nearest tabulated timestep, as the reference does.
    """

    def __init__(self, shift: float = 5.0, num_train_timesteps: int = 1000) -> None:
        sigmas = torch.linspace(1.0, 0.0, num_train_timesteps + 1)[:-1]
        self.sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
        self.timesteps = self.sigmas * num_train_timesteps
        self.num_train_timesteps = num_train_timesteps

    def denoising_timesteps(self, steps: Sequence[int], warp: bool) -> list[float]:
        if not warp:
            return [float(s) for s in steps]
        table = torch.cat([self.timesteps, torch.zeros(1)])
        return [float(table[self.num_train_timesteps - int(s)]) for s in steps]

    def sigma(self, timestep: float) -> float:
        index = int(torch.argmin((self.timesteps.double() - float(timestep)).abs()))
        return float(self.sigmas[index])

    def to_x0(self, velocity: torch.Tensor, x_t: torch.Tensor, timestep: float) -> torch.Tensor:
        """x0 = x_t - sigma_t v, in float64, returned in x_t's dtype."""
        sigma = self.sigma(timestep)
        return (x_t.double() - sigma * velocity.double()).to(x_t.dtype)

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, timestep: float) -> torch.Tensor:
        sigma = self.sigma(timestep)
        return ((1 - sigma) * x0.float() + sigma * noise.float()).to(x0.dtype)


@dataclass(frozen=True)
class CallInfo:
    """One model call of the generation, announced to observers before it runs."""

    block: int
    pass_: str
    step: int
    timestep: float
    start_frame: int
    num_frames: int


class GenerationObserver(Protocol):
    def begin_call(self, info: CallInfo) -> None: ...


@dataclass
class GenerationResult:
    latents: torch.Tensor
    calls: list[CallInfo] = field(default_factory=list)
    seconds: float = 0.0
    peak_memory_bytes: int | None = None
    kv_cache_bytes: int = 0


def block_causal_frame_mask(block_sizes: Sequence[int], local_attn_frames: int = -1, sink_frames: int = 0) -> torch.Tensor:
    """[F, F] bool, query frame x key frame: what KV-cache generation lets each frame see.

    A frame sees every frame up to the end of its block; with a window of L frames
    and S sinks, only the sinks and the L - S most recent frames of that range.
    """
    total = sum(block_sizes)
    ends = torch.empty(total, dtype=torch.long)
    start = 0
    for size in block_sizes:
        ends[start : start + size] = start + size
        start += size
    keys = torch.arange(total)[None, :]
    visible = keys < ends[:, None]
    if local_attn_frames != -1:
        recent = keys >= (ends[:, None] - (local_attn_frames - sink_frames))
        visible &= (keys < sink_frames) | recent
    return visible


def seeded_noise(seed: int, shape: Sequence[int]) -> torch.Tensor:
    """Standard normal noise from a CPU generator: the same values on every device."""
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(int(seed)))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def generate(
    model: WanModel,
    context: torch.Tensor,
    *,
    options: GenerationOptions,
    seed: int,
    observers: Iterable[GenerationObserver] = (),
) -> GenerationResult:
    """Generate one video's latents [1, C, F, H, W] with the real KV-cache procedure.

    ``context`` is the prompt's text embedding [1, L, text_dim] (L <= text_len).
    Observers hear of every call (block, pass, step, timestep) before it runs.
    """
    observers = list(observers)
    config = model.config
    device, dtype = model.device, model.dtype
    height = options.latent_height or config.latent_height
    width = options.latent_width or config.latent_width
    frame_seq_length = config.frame_seq_length(height, width)
    blocks = options.block_sizes()
    schedule = FlowMatchSchedule(options.timestep_shift, options.num_train_timesteps)
    timesteps = schedule.denoising_timesteps(options.denoising_steps, options.warp_denoising_step)
    num_steps = len(timesteps)

    # All noise up front, from one generator: the initial noise, then per block the
    # re-noising draws of steps 1..n-1, in the order the reference draws them.
    channels = config.in_dim
    latent_shape = (1, channels, options.num_frames, height, width)
    renoise_count = sum(blocks) * (num_steps - 1)
    noise = seeded_noise(seed, (options.num_frames + renoise_count, channels, height, width))
    initial = noise[: options.num_frames].permute(1, 0, 2, 3).unsqueeze(0).to(device, dtype)
    renoise = noise[options.num_frames :].to(device, dtype)

    cache = model.new_kv_cache(
        batch_size=1,
        frame_seq_length=frame_seq_length,
        capacity_frames=options.local_attn_frames if options.rolling else options.num_frames,
        rolling=options.rolling,
        sink_frames=options.sink_frames,
    )
    context = context.to(device, dtype)
    output = torch.empty(latent_shape, device=device, dtype=dtype)
    calls: list[CallInfo] = []

    def announce(info: CallInfo) -> None:
        calls.append(info)
        for observer in observers:
            observer.begin_call(info)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _synchronize(device)
    began = time.perf_counter()
    start = 0
    renoise_at = 0
    for block, frames in enumerate(blocks):
        x = initial[:, :, start : start + frames]
        x0 = x
        for step, t in enumerate(timesteps):
            announce(CallInfo(block, PASS_DENOISE, step, t, start, frames))
            velocity = model(x, torch.full((1, frames), t, device=device), context, kv_cache=cache, start_frame=start)
            x0 = schedule.to_x0(velocity, x, t)
            if step + 1 < num_steps:
                fresh = renoise[renoise_at : renoise_at + frames].permute(1, 0, 2, 3).unsqueeze(0)
                renoise_at += frames
                x = schedule.add_noise(x0, fresh, timesteps[step + 1])
        output[:, :, start : start + frames] = x0
        announce(CallInfo(block, PASS_CACHE, num_steps, float(options.context_noise), start, frames))
        model(
            x0,
            torch.full((1, frames), float(options.context_noise), device=device),
            None,
            kv_cache=cache,
            start_frame=start,
        )
        start += frames
    _synchronize(device)
    seconds = time.perf_counter() - began
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return GenerationResult(
        latents=output, calls=calls, seconds=seconds, peak_memory_bytes=peak, kv_cache_bytes=cache.nbytes
    )
