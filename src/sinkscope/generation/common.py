"""What every generation procedure shares: the flow-matching schedule, the noise stream,
the calls announced to observers, the host/device moves of latents, the clock.

The generation loop (``generation.loop``), its step rules and hooks build on these, so
that every procedure draws noise, reports calls and times itself the same way.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from sinkscope.model import WanModel
from sinkscope.options import GenerationOptions, OptionsError

PASS_DENOISE = "denoise"
PASS_CACHE = "cache"
PASS_RECACHE = "recache"
# Krea Realtime's call that rebuilds the cleared cache from the context frames (generation.krea).
PASS_RECOMPUTE = "recompute"


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
    # True for the calls of the video's last block (the Figure 4 view).
    is_last_block: bool = False
    # The prompt segment whose context the call uses (0 for a single prompt).
    segment: int = 0
    # Rolling Forcing's window call: one model call over several blocks at their own
    # noise levels; the tables count it as one call per block, these (empty otherwise).
    parts: tuple[CallInfo, ...] = ()

    @property
    def table_calls(self) -> tuple[CallInfo, ...]:
        """The calls the tables hold for this model call: its parts, or itself."""
        return self.parts or (self,)


class GenerationObserver(Protocol):
    def begin_call(self, info: CallInfo) -> None: ...


@dataclass
class GenerationResult:
    latents: torch.Tensor
    calls: list[CallInfo] = field(default_factory=list)
    seconds: float = 0.0
    peak_memory_bytes: int | None = None
    kv_cache_bytes: int = 0


class NoiseStream:
    """A generation's noise from one seeded CPU generator, in Self-Forcing's order.

    The values equal one draw of [num_frames + renoise_frames, C, H, W]: first the
    initial noise of every frame, then the re-noising draws ([frames, C, H, W] per
    step after the first) block by block. Only the initial noise is drawn up front;
    the rest is drawn when asked for. torch's CPU normal sampler fills 16 values at a
    time, so consecutive draws whose sizes are multiples of 16 continue one stream
    exactly (tests check it); for other frame sizes everything is drawn up front.
    """

    def __init__(self, seed: int, num_frames: int, frame_shape: Sequence[int], renoise_frames: int) -> None:
        self.frame_shape = tuple(int(s) for s in frame_shape)
        self._generator = torch.Generator().manual_seed(int(seed))
        self.streaming = math.prod(self.frame_shape) % 16 == 0
        if self.streaming:
            self.initial = torch.randn((num_frames, *self.frame_shape), generator=self._generator)
            self._rest = None
        else:
            drawn = torch.randn((num_frames + renoise_frames, *self.frame_shape), generator=self._generator)
            self.initial, self._rest = drawn[:num_frames], drawn[num_frames:]
        self._drawn = 0
        self._renoise_frames = renoise_frames

    def renoise(self, frames: int) -> torch.Tensor:
        """The next ``frames`` re-noising frames, [frames, C, H, W] on the CPU."""
        if self._drawn + frames > self._renoise_frames:
            raise ValueError(f"only {self._renoise_frames} re-noising frames were planned")
        if self.streaming:
            out = torch.randn((frames, *self.frame_shape), generator=self._generator)
        else:
            out = self._rest[self._drawn : self._drawn + frames]
        self._drawn += frames
        return out


def latents_to_device(frames: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """CPU noise [F, C, H, W] as latents [1, C, F, H, W] on ``device``, without a host sync on CUDA."""
    latents = frames.permute(1, 0, 2, 3).unsqueeze(0)
    if device.type == "cuda":
        return latents.contiguous().pin_memory().to(device, dtype, non_blocking=True)
    return latents.to(device, dtype)


def latents_to_host(latents: torch.Tensor) -> torch.Tensor:
    """A block's latents on the CPU; from CUDA into pinned memory, queued without a host sync."""
    if latents.device.type != "cuda":
        return latents
    host = torch.empty(latents.shape, dtype=latents.dtype, pin_memory=True)
    return host.copy_(latents, non_blocking=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def latent_grid(model: WanModel, options: GenerationOptions) -> tuple[int, int, int]:
    """(latent height, latent width, tokens a frame) of a generation."""
    config = model.config
    height = options.latent_height or config.latent_height
    width = options.latent_width or config.latent_width
    return height, width, config.frame_seq_length(height, width)


class CallLog:
    """The calls of a generation, as the tables count them; observers hear of each model
    call before it runs."""

    def __init__(self, observers: Iterable[GenerationObserver]) -> None:
        self.observers = list(observers)
        self.calls: list[CallInfo] = []

    def announce(self, info: CallInfo) -> None:
        self.calls.extend(info.table_calls)
        for observer in self.observers:
            observer.begin_call(info)


class GenerationClock:
    """Wall time and peak device memory of the denoising loop (synchronized at both ends)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        synchronize(device)
        self.began = time.perf_counter()

    def result(self, outputs: Sequence[torch.Tensor], log: CallLog, kv_cache_bytes: int) -> GenerationResult:
        synchronize(self.device)
        seconds = time.perf_counter() - self.began
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        return GenerationResult(
            latents=torch.cat(list(outputs), dim=2),
            calls=log.calls,
            seconds=seconds,
            peak_memory_bytes=peak,
            kv_cache_bytes=kv_cache_bytes,
        )


def prompt_schedule(
    context: torch.Tensor | Sequence[tuple[int, torch.Tensor]], options: GenerationOptions
) -> list[tuple[int, torch.Tensor]]:
    """(start frame, context) of every prompt segment, checked against the blocks."""
    # An entry may carry its prompt's text third (LongLive 2.0's procedure reads it; the others do not).
    schedule = [(0, context)] if isinstance(context, torch.Tensor) else [(int(f), c) for f, c, *_ in context]
    starts = [start for start, _ in schedule]
    blocks = options.block_starts()
    if not schedule or starts[0] != 0:
        raise OptionsError(f"a prompt schedule starts at frame 0, not {starts[:1]}")
    for previous, start in zip(starts, starts[1:]):
        if not previous < start < options.num_frames or start not in blocks:
            raise OptionsError(
                f"prompt switch at frame {start}: switches lie at block starts {blocks[1:]} in increasing order"
            )
    options.check_prompt_switches(starts[1:])
    return schedule
