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

This module holds ``generate``, the public entry point, which runs the procedure
``generation.procedure`` names (``procedures.PROCEDURE_FUNCTIONS``), and Self-Forcing's
block procedure (``generate_blocks``, registered as ``self_forcing``). Rolling Forcing's
procedure is ``sinkscope.generation.rolling``; what the procedures share (schedule,
noise stream, calls, host/device moves, clock) is ``sinkscope.generation.common``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from sinkscope.generation.common import (
    PASS_CACHE,
    PASS_DENOISE,
    PASS_RECACHE,
    CallInfo,
    CallLog,
    FlowMatchSchedule,
    GenerationClock,
    GenerationObserver,
    GenerationResult,
    NoiseStream,
    latent_grid,
    latents_to_device,
    latents_to_host,
    prompt_schedule,
    synchronize,
)
from sinkscope.generation.procedures import procedure_function, register_procedure
from sinkscope.model import WanModel
from sinkscope.model.policies import policy_from_options
from sinkscope.options import SELF_FORCING_PROCEDURE, GenerationOptions


def block_causal_frame_mask(
    block_sizes: Sequence[int], local_attn_frames: int = -1, sink_frames: int = 0
) -> torch.Tensor:
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


@torch.inference_mode()
def generate(
    model: WanModel,
    context: torch.Tensor | Sequence[tuple[int, torch.Tensor]],
    *,
    options: GenerationOptions,
    seed: int,
    observers: Iterable[GenerationObserver] = (),
    vae: object | None = None,
) -> GenerationResult:
    """Generate one video's latents [1, C, F, H, W] (on the CPU) with the real KV-cache procedure.

    ``context`` is the prompt's text embedding [1, L, text_dim] (L <= text_len), or a
    prompt schedule: (start frame, embedding) per segment, the first at frame 0, the
    others at block starts. Observers hear of every call (block, pass, step, timestep,
    prompt segment) before it runs. The calls are those of the procedure
    ``options.procedure`` names: Self-Forcing's blocks (``generate_blocks``), Rolling
    Forcing's rolling window (``sinkscope.generation.rolling.generate_rolling``), or any
    other registered with ``procedures.register_procedure``. ``vae``: the Wan VAE, for a
    procedure that decodes and re-encodes frames (``krea_recompute``); passed only when given.
    """
    run = procedure_function(options.procedure)
    extra = {} if vae is None else {"vae": vae}
    return run(model, context, options=options, seed=seed, observers=observers, **extra)


@register_procedure(SELF_FORCING_PROCEDURE)
@torch.inference_mode()
def generate_blocks(
    model: WanModel,
    context: torch.Tensor | Sequence[tuple[int, torch.Tensor]],
    *,
    options: GenerationOptions,
    seed: int,
    observers: Iterable[GenerationObserver] = (),
) -> GenerationResult:
    """Self-Forcing's block procedure (``procedure: self_forcing``); as ``generate``.

    A prompt may switch at block starts. The steps are numbered as in Self-Forcing's
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
    """
    config = model.config
    device, dtype = model.device, model.dtype
    height, width, frame_seq_length = latent_grid(model, options)
    blocks = options.block_sizes()
    schedule = prompt_schedule(context, options)
    flow = FlowMatchSchedule(options.timestep_shift, options.num_train_timesteps)
    block_timesteps = [
        flow.denoising_timesteps(options.block_steps(b), options.warp_denoising_step) for b in range(len(blocks))
    ]

    # One seeded generator: the initial noise, then per block the re-noising draws of
    # steps 1..n-1, in the order the reference draws them; each block's slice goes to
    # the device when the block starts.
    renoise = sum(frames * (len(steps) - 1) for frames, steps in zip(blocks, block_timesteps))
    noise = NoiseStream(seed, options.num_frames, (config.in_dim, height, width), renoise)

    # Step 1: the KV cache, sized by the policy (the cross-attention K/V come with it).
    cache = policy_from_options(model, options, frame_seq_length=frame_seq_length, seed=seed)
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
                synchronize(device)  # the finished blocks' host copies are complete
                kept = latents_to_device(
                    torch.cat(outputs, dim=2)[0, :, start - count : start].transpose(0, 1), device, dtype
                )
                announce(
                    CallInfo(block, PASS_RECACHE, 0, float(options.context_noise), start - count, count, last, segment)
                )
                cache.begin_recache(start - count, count)
                model(
                    kept,
                    torch.full((1, count), float(options.context_noise), device=device),
                    contexts[segment],
                    kv_cache=cache,
                    start_frame=start - count,
                    cache_only=True,
                )
        x = latents_to_device(noise.initial[start : start + frames], device, dtype)
        x0 = x
        # Step 3.1: the spatial denoising loop.
        for step, t in enumerate(timesteps):
            announce(CallInfo(block, PASS_DENOISE, step, t, start, frames, last, segment))
            velocity = model(
                x, torch.full((1, frames), t, device=device), contexts[segment], kv_cache=cache, start_frame=start
            )
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
