"""What one training step of the demo computes (``sinkscope.demo.train``): its batch, a
flow-matching batch of fresh synthetic videos or a point of a teacher's ODE trajectory,
and its loss.

Every random draw is taken from the run's generator in a fixed order (the data from a
CPU generator of its own, seeded by the step), so a seed gives the same weights on the
CPU, and a run stopped and resumed the weights of one run in one go.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from sinkscope.demo import data as synthetic
from sinkscope.demo.objective import sample_block_timesteps, teacher_forcing_forward
from sinkscope.model import WanModel


class BatchSettings(Protocol):
    """What a batch reads of ``sinkscope.demo.train.TrainConfig`` (a protocol, so this module
    does not import the trainer that imports it)."""

    seed: int
    batch_size: int
    mode: str
    clean_prob: float
    sampler_prob: float

    def data_options(self) -> dict[str, Any]: ...


@dataclass
class Batch:
    """One step's videos: the clean latents, the noisy input at each frame's timestep,
    the regression target, its weight (None: plain mean-squared error) and the class ids."""

    x0: torch.Tensor  # [B, C, F, H, W]
    x_t: torch.Tensor
    t_frames: torch.Tensor  # [B, F]
    target: torch.Tensor
    weight: torch.Tensor | None
    labels: torch.Tensor  # [B]


def data_seed(seed: int, step: int, micro: int = 0) -> int:
    """The data seed of a training step: training videos come from seeds of their own
    range; evaluation uses others."""
    return (int(seed) % (1 << 20)) * (1 << 40) + step * 16 + micro


def flow_batch(
    config: BatchSettings,
    step: int,
    generator: torch.Generator,
    sampler_ts: torch.Tensor,
    block_sizes: Sequence[int],
) -> Batch:
    """Flow matching on the synthetic videos of ``step``:
    x_t = (1 - sigma) x0 + sigma noise, target v = noise - x0, one timestep a block
    (``sample_block_timesteps``), one a video in ``bidirectional`` mode, clean blocks
    (t = 0) drawn with ``clean_prob`` in ``diffusion_forcing`` mode."""
    device = generator.device
    blocks, block_len = len(block_sizes), block_sizes[0]
    batch = synthetic.synthetic_batch(
        data_seed(config.seed, step), config.batch_size, device=device, **config.data_options()
    )
    x0 = batch.latents
    noise = torch.randn(x0.shape, generator=generator, device=device)
    t_blocks = sample_block_timesteps(
        config.batch_size,
        blocks,
        generator=generator,
        device=device,
        sampler_prob=config.sampler_prob,
        sampler_ts=sampler_ts,
    )
    if config.mode == "bidirectional":  # one noise level for the whole video, as Wan is trained
        t_blocks = t_blocks[:, :1].expand(-1, blocks)
    if config.mode == "diffusion_forcing":
        clean = torch.rand(config.batch_size, blocks, generator=generator, device=device) < config.clean_prob
        t_blocks = torch.where(clean, torch.zeros_like(t_blocks), t_blocks)
    t_frames = t_blocks.repeat_interleave(block_len, dim=1)  # [B, F]
    sigma = (t_frames / 1000.0)[:, None, :, None, None]
    x_t = (1 - sigma) * x0 + sigma * noise
    return Batch(x0, x_t, t_frames, noise - x0, None, batch.labels)


def ode_batch(
    config: BatchSettings,
    pool: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    generator: torch.Generator,
    sampler_ts: torch.Tensor,
    block_sizes: Sequence[int],
) -> Batch:
    """ODE distillation: videos drawn from the teacher's trajectories (``pool``: their
    ends, their states at the sampler's timesteps, their class ids), one sampler timestep
    a block; the target is the velocity whose x0 = x_t - sigma v is the trajectory's end,
    weighted by sigma^2 so that the loss is the x0 error."""
    device = generator.device
    blocks, block_len = len(block_sizes), block_sizes[0]
    pool_x0, pool_states, pool_labels = pool
    index = torch.randint(len(pool_x0), (config.batch_size,), generator=generator, device=device)
    x0, labels = pool_x0[index].float(), pool_labels[index]
    which = torch.randint(len(sampler_ts), (config.batch_size, blocks), generator=generator, device=device)
    which = which.repeat_interleave(block_len, dim=1)  # [B, F]
    states = pool_states[index]  # [B, 4, C, F, H, W]
    pick = which[:, None, None, :, None, None].expand(-1, 1, *states.shape[2:])
    x_t = states.gather(1, pick).squeeze(1).float()
    t_frames = sampler_ts[which]
    sigma = (t_frames / 1000.0)[:, None, :, None, None]
    return Batch(x0, x_t, t_frames, (x_t - x0) / sigma, sigma**2, labels)


def batch_loss(
    net: WanModel,
    batch: Batch,
    context: torch.Tensor,
    mode: str,
    *,
    block_sizes: Sequence[int],
    masks: dict[str, torch.Tensor],
    amp_dtype: torch.dtype | None,
) -> torch.Tensor:
    """The step's loss: the model's prediction (teacher forcing's two copies, or one copy
    under the diffusion-forcing mask or full attention) against the target; weighted when
    the batch has weights, and over the noisy frames only in diffusion forcing (its clean
    blocks are context). ``masks``: ``teacher_forcing`` and ``diffusion_forcing``."""
    device_type = batch.x_t.device.type
    with torch.autocast(device_type, dtype=amp_dtype, enabled=amp_dtype is not None):
        if mode == "teacher_forcing":
            pred = teacher_forcing_forward(
                net, batch.x0, batch.x_t, batch.t_frames, context, block_sizes, masks["teacher_forcing"]
            )
        else:
            mask = masks["diffusion_forcing"] if mode == "diffusion_forcing" else None
            pred = net(batch.x_t, batch.t_frames, context, frame_mask=mask)
    err = (pred.float() - batch.target) ** 2
    if batch.weight is not None:
        return (err * batch.weight).mean()
    if mode != "diffusion_forcing":
        return err.mean()
    noisy = (batch.t_frames > 0).float()[:, None, :, None, None].expand_as(err)
    return (err * noisy).sum() / noisy.sum().clamp_min(1.0)
