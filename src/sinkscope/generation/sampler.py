"""The entry point of generation: ``generate`` runs the procedure ``generation.procedure`` names.

Every procedure (``sinkscope.generation.procedures``) is a step rule and hooks around the
one loop of ``sinkscope.generation.loop``, whose steps are numbered as Self-Forcing's
``inference()``: Self-Forcing's blocks (``self_forcing``, with Causal Forcing's
first-block steps and LongLive's prompt switches and re-cache), Rolling Forcing's
window (``rolling``), Krea Realtime's recomputed cache (``krea``), LongLive 2.0's chunks
(``longlive2``). What the KV cache keeps is the cache policy's business
(``sinkscope.model.policies``); device memory stays flat under a bounded policy: the
cache is sized by the policy, noise goes to the device one block at a time and the
finished latents come back to the CPU block by block.

Also here: the block-causal frame mask of KV-cache generation (for full forwards that
stand in for it) and seeded noise that is the same on every device.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from sinkscope.generation.common import GenerationObserver, GenerationResult
from sinkscope.generation.procedures import procedure_code
from sinkscope.model import WanModel
from sinkscope.options import GenerationOptions


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
    context: torch.Tensor | Sequence[tuple],
    *,
    options: GenerationOptions,
    seed: int,
    observers: Iterable[GenerationObserver] = (),
    vae: object | None = None,
) -> GenerationResult:
    """Generate one video's latents [1, C, F, H, W] (on the CPU) with the real KV-cache procedure.

    ``context`` is the prompt's text embedding [1, L, text_dim] (L <= text_len), or a
    prompt schedule: (start frame, embedding) per segment, the first at frame 0, the
    others at block starts (an entry may carry the prompt's text third: LongLive 2.0's
    scene cuts read it). Observers hear of every call (block, pass, step, timestep, prompt
    segment) before it runs. The calls are those of the procedure ``options.procedure``
    names (``procedures.PROCEDURES``). ``vae``: the Wan VAE, for a procedure that decodes
    and re-encodes frames (``krea_recompute``).
    """
    procedure = procedure_code(options.procedure)
    return procedure(model, context, options=options, seed=seed, observers=observers, vae=vae)
