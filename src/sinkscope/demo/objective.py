"""The demo's training objective: flow matching under teacher forcing (the clean video
as the KV cache sees it, then its noisy copy) or diffusion forcing, per-block timesteps,
and the class prompts' contexts."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from sinkscope.demo import data as synthetic
from sinkscope.generation.common import FlowMatchSchedule
from sinkscope.generation.sampler import block_causal_frame_mask
from sinkscope.model import (
    WanConfig,
    WanModel,
    get_model_config,
)
from sinkscope.model.text import demo_embedding
from sinkscope.options import GenerationOptions

MODES = ("teacher_forcing", "diffusion_forcing", "bidirectional")


def sampler_timesteps(options: GenerationOptions | None = None) -> list[float]:
    """The timesteps the few-step sampler calls the model at (1000, 937.5, 833.3, 625)."""
    options = options or GenerationOptions()
    schedule = FlowMatchSchedule(options.timestep_shift, options.num_train_timesteps)
    return schedule.denoising_timesteps(options.denoising_steps, options.warp_denoising_step)


def class_contexts(model: str | WanConfig = "demo", classes: Sequence[str] = synthetic.CLASSES) -> torch.Tensor:
    """[classes, text_len, text_dim]: the demo text embedding of every class prompt.

    Zero-padded to text_len rows, as the transformer pads a prompt's embedding, so
    the conditioning equals what the pipeline feeds for the same prompt text.
    """
    config = get_model_config(model)
    return torch.stack([_padded_embedding(synthetic.CLASS_PROMPTS[name], config) for name in classes])


def empty_context(model: str | WanConfig = "demo") -> torch.Tensor:
    """[text_len, text_dim]: the demo embedding of the empty prompt, zero-padded.

    The unconditional input: what training with ``cond_dropout`` feeds in place of a
    class prompt, and what classifier-free guidance contrasts the prompt with.
    """
    return _padded_embedding("", get_model_config(model))


def _padded_embedding(text: str, config: WanConfig) -> torch.Tensor:
    """[text_len, text_dim]: ``text``'s demo embedding, zero-padded to text_len rows."""
    emb = demo_embedding(text, config.text_dim, config.text_len)
    return F.pad(emb, (0, 0, 0, config.text_len - emb.shape[0]))


def teacher_forcing_mask(block_sizes: Sequence[int]) -> torch.Tensor:
    """[2F, 2F] bool for the sequence (clean frames, noisy frames); True = visible.

    Clean frame rows: the clean frames up to the end of their block (the cache).
    Noisy frame rows: the clean frames of earlier blocks, and the noisy frames of
    their own block (what a denoising step of KV-cache generation sees).
    """
    frames = sum(block_sizes)
    causal = block_causal_frame_mask(block_sizes)
    starts = torch.empty(frames, dtype=torch.long)
    block_of = torch.empty(frames, dtype=torch.long)
    start = 0
    for index, size in enumerate(block_sizes):
        starts[start : start + size] = start
        block_of[start : start + size] = index
        start += size
    keys = torch.arange(frames)[None, :]
    earlier_clean = keys < starts[:, None]
    same_block = block_of[:, None] == block_of[None, :]
    mask = torch.zeros(2 * frames, 2 * frames, dtype=torch.bool)
    mask[:frames, :frames] = causal
    mask[frames:, :frames] = earlier_clean
    mask[frames:, frames:] = same_block
    return mask


class _TwinRope:
    """RoPE tables for (clean, noisy) copies of one video: positions 0..F-1 twice."""

    def __init__(self, base, frames: int) -> None:
        self.base = base
        self.frames = frames
        self._cache: dict[tuple, torch.Tensor] = {}

    def phases(self, start_frame, frames, height, width, device, dtype):
        if start_frame != 0 or frames != 2 * self.frames:
            raise ValueError(
                f"teacher forcing expects 2 x {self.frames} frames from frame 0, got {frames} from {start_frame}"
            )
        key = (height, width, device, dtype)
        if key not in self._cache:
            half = self.base.phases(0, self.frames, height, width, device, dtype)
            self._cache[key] = torch.cat([half, half], dim=0)
        return self._cache[key]


def teacher_forcing_forward(
    model: WanModel,
    clean: torch.Tensor,
    noisy: torch.Tensor,
    timestep: torch.Tensor,
    context: torch.Tensor,
    block_sizes: Sequence[int],
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The velocity the model predicts for ``noisy`` [B, C, F, H, W] at per-frame
    ``timestep`` [B, F], with the clean video as block-causal context (t = 0)."""
    frames = clean.shape[2]
    if mask is None:
        mask = teacher_forcing_mask(block_sizes)
    latents = torch.cat([clean, noisy], dim=2)
    t = torch.cat([torch.zeros_like(timestep), timestep], dim=1)
    saved = model.rope
    model.rope = saved if isinstance(saved, _TwinRope) else _TwinRope(saved, frames)
    try:
        out = model(latents, t, context, frame_mask=mask)
    finally:
        model.rope = saved
    return out[:, :, frames:]


def sample_block_timesteps(
    batch: int,
    blocks: int,
    *,
    generator: torch.Generator,
    device: torch.device,
    sampler_prob: float,
    sampler_ts: torch.Tensor,
    shift: float = 5.0,
) -> torch.Tensor:
    """[B, blocks] timesteps: a sampler timestep with probability ``sampler_prob``,
    else t = 1000 s u / (1 + (s - 1) u), u ~ U(0, 1] (the shifted schedule)."""
    pick = torch.randint(len(sampler_ts), (batch, blocks), generator=generator, device=device)
    u = 1.0 - torch.rand(batch, blocks, generator=generator, device=device)  # (0, 1]
    continuous = 1000.0 * shift * u / (1 + (shift - 1) * u)
    use_sampler = torch.rand(batch, blocks, generator=generator, device=device) < sampler_prob
    return torch.where(use_sampler, sampler_ts[pick], continuous)
