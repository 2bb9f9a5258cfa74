"""LongLive 2.0's chunk procedure (``generation.procedure: longlive2``).

Its inference (L ``pipeline/causal_diffusion_inference.py`` 532-699), T2V, guidance 1:

- the video's latent frames are generated chunk by chunk (8 frames a chunk);
- per chunk, a new UniPC flow sampler (``sinkscope.generation.unipc``; 4 steps, shift 5:
  t = 999, 937, 833, 624): one call per step on the chunk's slice of the noise, the
  velocity straight into the sampler, no noise drawn between steps;
- the finished chunk runs once more at t = 0 (the clean pass, ``pass`` = ``cache``),
  writing its keys and values into the cache;
- a chunk (other than chunk 0) whose prompt starts with ``SCENE_CUT_PREFIX`` ("The scene
  transitions. ") starts a new shot: its RoPE positions move on by 8 a shot from its first
  call, and after its clean pass it is pinned as the shot sink
  (``sinkscope.model.policies.LongLive2Policy``).

A chunk's prompt is the prompt segment active at its first frame; prompt segments switch
at chunk starts (``prompts:`` schedules). Every chunk of a segment whose text starts with
the prefix counts as a cut, as their code checks each chunk's own prompt; their datasets
give the prefix to a shot's first chunk only, so write such a shot as a one-chunk segment
with the prefix followed by a segment without it. The cut needs the texts: a prompt
schedule passed as (start frame, embedding, text) entries (the extraction job passes
them); without texts no chunk is a cut.

Noise: one draw of [frames, C, H, W] from a seeded CPU generator for the whole video
(LongLive draws it in bf16 on CUDA, so the values differ from theirs); each chunk takes
its slice. Their cross-attention recomputes the prompt's keys and values on every call;
here they are computed once per prompt segment (the same numbers).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from sinkscope.generation.common import (
    PASS_CACHE,
    PASS_DENOISE,
    CallInfo,
    CallLog,
    GenerationClock,
    GenerationObserver,
    GenerationResult,
    NoiseStream,
    latent_grid,
    latents_to_device,
    latents_to_host,
    prompt_schedule,
)
from sinkscope.generation.procedures import register_procedure
from sinkscope.generation.unipc import UniPCFlowSampler
from sinkscope.model import WanModel
from sinkscope.model.policies import policy_from_options
from sinkscope.options import LONGLIVE2, GenerationOptions

# Their scene_cut_prefix default (L utils/dataset.py:22).
SCENE_CUT_PREFIX = "The scene transitions. "


def prompt_texts(context: torch.Tensor | Sequence[tuple]) -> list[str | None]:
    """The text of every prompt segment of a schedule (None where an entry carries none)."""
    if isinstance(context, torch.Tensor):
        return [None]
    return [str(entry[2]) if len(entry) > 2 and entry[2] is not None else None for entry in context]


def scene_cuts(chunk_starts: Sequence[int], segment_starts: Sequence[int], texts: Sequence[str | None]) -> list[bool]:
    """Per chunk: whether it starts a new shot (its prompt starts with SCENE_CUT_PREFIX;
    never chunk 0, never under a single prompt, as their ``_is_shot_boundary``)."""
    if len(segment_starts) < 2:
        return [False] * len(chunk_starts)
    cuts = []
    for index, start in enumerate(chunk_starts):
        segment = max(i for i, s in enumerate(segment_starts) if s <= start)
        text = texts[segment]
        cuts.append(index > 0 and text is not None and text.startswith(SCENE_CUT_PREFIX))
    return cuts


@register_procedure(LONGLIVE2)
@torch.inference_mode()
def generate_longlive2(
    model: WanModel,
    context: torch.Tensor | Sequence[tuple],
    *,
    options: GenerationOptions,
    seed: int,
    observers: Iterable[GenerationObserver] = (),
) -> GenerationResult:
    """LongLive 2.0's chunks (``procedure: longlive2``); as ``sampler.generate``."""
    config = model.config
    device, dtype = model.device, model.dtype
    height, width, frame_seq_length = latent_grid(model, options)
    chunks = options.block_sizes()
    starts = options.block_starts()
    schedule = prompt_schedule(context, options)
    segment_starts = [start for start, _ in schedule]
    cuts = scene_cuts(starts, segment_starts, prompt_texts(context))
    noise = NoiseStream(seed, options.num_frames, (config.in_dim, height, width), 0)

    cache = policy_from_options(model, options, frame_seq_length=frame_seq_length, seed=seed)
    contexts = [c.to(device, dtype) for _, c in schedule]
    switches = {start: index for index, (start, _) in enumerate(schedule) if index}
    outputs: list[torch.Tensor] = []
    log = CallLog(observers)
    clock = GenerationClock(device)
    segment = 0
    clean = float(options.context_noise)
    for chunk, (start, frames) in enumerate(zip(starts, chunks)):
        last = chunk == len(chunks) - 1
        if start in switches:
            segment = switches[start]
            cache.cache.forget_context()  # the next call computes the new prompt's cross-attention K/V
        if cuts[chunk]:
            cache.begin_shot()
        sampler = UniPCFlowSampler(len(options.denoising_steps), options.timestep_shift, 2, options.num_train_timesteps)
        x = latents_to_device(noise.initial[start : start + frames], device, dtype)
        for step, t in enumerate(sampler.timesteps.tolist()):
            log.announce(CallInfo(chunk, PASS_DENOISE, step, float(t), start, frames, last, segment))
            velocity = model(
                x,
                torch.full((1, frames), float(t), device=device),
                contexts[segment],
                kv_cache=cache,
                start_frame=start,
            )
            x = sampler.step(velocity, x)
        outputs.append(latents_to_host(x))
        # The clean pass: the chunk's keys and values at t = 0 overwrite its slots.
        log.announce(CallInfo(chunk, PASS_CACHE, len(sampler.timesteps), clean, start, frames, last, segment))
        model(
            x, torch.full((1, frames), clean, device=device), None, kv_cache=cache, start_frame=start, cache_only=True
        )
        if cuts[chunk]:
            cache.pin_block()
    return clock.result(outputs, log, cache.nbytes)
