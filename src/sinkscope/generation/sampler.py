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
[1000, 750, 500, 250] "warped" through it gives t = 1000, 937.5, 833.3, 625. The first
block may have steps of its own (Causal Forcing++: 4 for block 0, then 1 or 2).

A prompt may switch between blocks (LongLive's interactive generation): from the switch
on the cross-attention context is the new prompt's, and with ``re_cache`` one more call
(the "re-cache pass", before the new block) runs the last min(W, F) generated frames
(every frame under ``global``) through the model under the new prompt at the context
timestep, overwriting the keys/values the cache keeps of them (the sink's excepted, as
LongLive's ``global_sink``); ``sinkscope.model.policies.CachePolicy.begin_recache``.
All noise comes from one seeded CPU generator, in the order Self-Forcing draws it
(the initial noise of every frame, then the re-noising draws block by block), so a
seed gives the same video on any device. What the KV cache keeps is the cache
policy's business (``sinkscope.model.policies``); device memory stays flat under a bounded
policy: the cache is sized by the policy, noise goes to the device one block at a
time and the finished latents come back to the CPU block by block.

Rolling Forcing's procedure (``generation.procedure: rolling_forcing``) lives in
``sinkscope.generation.rolling`` and shares this module's helpers (``CallLog``,
``latent_grid``, the noise stream, the host/device moves).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from sinkscope.model import WanModel
from sinkscope.model.policies import policy_from_options
from sinkscope.options import GenerationOptions, OptionsError

PASS_DENOISE = "denoise"
PASS_CACHE = "cache"
PASS_RECACHE = "recache"


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


def _synchronize(device: torch.device) -> None:
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
        _synchronize(device)
        self.began = time.perf_counter()

    def result(self, outputs: Sequence[torch.Tensor], log: CallLog, kv_cache_bytes: int) -> GenerationResult:
        _synchronize(self.device)
        seconds = time.perf_counter() - self.began
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        return GenerationResult(latents=torch.cat(list(outputs), dim=2), calls=log.calls, seconds=seconds,
                                peak_memory_bytes=peak, kv_cache_bytes=kv_cache_bytes)  # fmt: skip


def prompt_schedule(
    context: torch.Tensor | Sequence[tuple[int, torch.Tensor]], options: GenerationOptions
) -> list[tuple[int, torch.Tensor]]:
    """(start frame, context) of every prompt segment, checked against the blocks."""
    schedule = [(0, context)] if isinstance(context, torch.Tensor) else [(int(f), c) for f, c in context]
    starts = [start for start, _ in schedule]
    blocks = options.block_starts()
    if not schedule or starts[0] != 0:
        raise OptionsError(f"a prompt schedule starts at frame 0, not {starts[:1]}")
    for previous, start in zip(starts, starts[1:]):
        if not previous < start < options.num_frames or start not in blocks:
            raise OptionsError(f"prompt switch at frame {start}: switches lie at block starts {blocks[1:]} in increasing order")
    options.check_prompt_switches(starts[1:])
    return schedule


@torch.inference_mode()
def generate(
    model: WanModel,
    context: torch.Tensor | Sequence[tuple[int, torch.Tensor]],
    *,
    options: GenerationOptions,
    seed: int,
    observers: Iterable[GenerationObserver] = (),
) -> GenerationResult:
    """Generate one video's latents [1, C, F, H, W] (on the CPU) with the real KV-cache procedure.

    ``context`` is the prompt's text embedding [1, L, text_dim] (L <= text_len), or a
    prompt schedule: (start frame, embedding) per segment, the first at frame 0, the
    others at block starts. Observers hear of every call (block, pass, step, timestep,
    prompt segment) before it runs. The steps are numbered as in Self-Forcing's
    ``inference()``:

    1. initialize the KV cache (here: the cache policy and its storage);
    2. cache the context feature (T2V has no initial latent; the text K/V are cached
       on the first call);
    3. the temporal denoising loop, block by block:
       3.0 at a prompt switch: the new context, and (``re_cache``) the re-cache pass
           over the kept frames (LongLive's ``_recache_after_switch``);
       3.1 the spatial denoising loop (one call per step, re-noising between steps);
       3.2 record the block's output;
       3.3 rerun at the context timestep to update the KV cache with clean keys;
       3.4 move the start frame on;
    4. (decoding to pixels is not done here).

    Under ``procedure: rolling_forcing`` the calls are Rolling Forcing's rolling window
    instead (``sinkscope.generation.rolling.generate_rolling``).
    """
    if options.rolling_forcing:
        from sinkscope.generation.rolling import generate_rolling

        return generate_rolling(model, context, options=options, seed=seed, observers=observers)
    config = model.config
    device, dtype = model.device, model.dtype
    height, width, frame_seq_length = latent_grid(model, options)
    blocks = options.block_sizes()
    schedule = prompt_schedule(context, options)
    flow = FlowMatchSchedule(options.timestep_shift, options.num_train_timesteps)
    block_timesteps = [flow.denoising_timesteps(options.block_steps(b), options.warp_denoising_step) for b in range(len(blocks))]

    # One seeded generator: the initial noise, then per block the re-noising draws of
    # steps 1..n-1, in the order the reference draws them; each block's slice goes to
    # the device when the block starts.
    renoise = sum(frames * (len(steps) - 1) for frames, steps in zip(blocks, block_timesteps))
    noise = NoiseStream(seed, options.num_frames, (config.in_dim, height, width), renoise)

    # Step 1: the KV cache, sized by the policy (the cross-attention K/V come with it).
    cache = policy_from_options(model, options, frame_seq_length=frame_seq_length)
    contexts = [c.to(device, dtype) for _, c in schedule]
    switches = {start: index for index, (start, _) in enumerate(schedule) if index}
    outputs: list[torch.Tensor] = []
    log = CallLog(observers)
    announce = log.announce
    clock = GenerationClock(device)
    # Step 2: no initial latent (T2V); the first call caches the text K/V.
    # Step 3: the temporal denoising loop.
    start, segment = 0, 0
    for block, frames in enumerate(blocks):
        last = block == len(blocks) - 1
        timesteps = block_timesteps[block]
        num_steps = len(timesteps)
        if start in switches:
            # Step 3.0: the new prompt's cross-attention K/V, computed by the next call.
            segment = switches[start]
            cache.cache.forget_context()
            if options.recaches:
                count = options.recache_frames(start)
                _synchronize(device)  # the finished blocks' host copies are complete
                kept = latents_to_device(torch.cat(outputs, dim=2)[0, :, start - count : start].transpose(0, 1), device, dtype)
                announce(CallInfo(block, PASS_RECACHE, 0, float(options.context_noise), start - count, count, last, segment))
                cache.begin_recache(start - count, count)
                model(kept, torch.full((1, count), float(options.context_noise), device=device), contexts[segment],
                      kv_cache=cache, start_frame=start - count, cache_only=True)  # fmt: skip
        x = latents_to_device(noise.initial[start : start + frames], device, dtype)
        x0 = x
        # Step 3.1: the spatial denoising loop.
        for step, t in enumerate(timesteps):
            announce(CallInfo(block, PASS_DENOISE, step, t, start, frames, last, segment))
            velocity = model(x, torch.full((1, frames), t, device=device), contexts[segment], kv_cache=cache,
                             start_frame=start)  # fmt: skip
            x0 = flow.to_x0(velocity, x, t)
            if step + 1 < num_steps:
                fresh = latents_to_device(noise.renoise(frames), device, dtype)
                x = flow.add_noise(x0, fresh, timesteps[step + 1])
        # Step 3.2: record the output (on the CPU, so it does not grow on the device).
        outputs.append(latents_to_host(x0))
        # Step 3.3: rerun at the context timestep so the cache holds the block's clean K/V.
        announce(CallInfo(block, PASS_CACHE, num_steps, float(options.context_noise), start, frames, last, segment))
        model(
            x0,
            torch.full((1, frames), float(options.context_noise), device=device),
            None,
            kv_cache=cache,
            start_frame=start,
            cache_only=True,
        )
        # Step 3.4: the next block starts after this one.
        start += frames
    return clock.result(outputs, log, cache.nbytes)
