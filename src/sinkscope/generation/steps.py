"""The step rules of the block procedures (step 3.1 of ``generation.loop``): how a block's
few model calls take its noise to its latents.

- ``DMDSteps``: Self-Forcing's few-step sampler (DMD distillation): per step the model's
  velocity at t gives x0 = x_t - sigma_t v (float64), and, unless it was the last step, x0
  is re-noised with fresh noise to the next timestep, (1 - sigma') x0 + sigma' eps. The
  timesteps are the shifted flow-matching table's (``FlowMatchSchedule``) at the denoising
  steps (warped: [1000, 750, 500, 250] gives 1000, 937.5, 833.3, 625); the first block may
  have steps of its own (Causal Forcing++). Krea Realtime's procedure runs it with its own
  steps (``krea.krea_denoising_steps``). Its re-noising draws come block by block, after
  the initial noise of every frame, in the reference's order.
- ``UniPCSteps``: LongLive 2.0's sampler: per block a new multistep UniPC flow sampler
  (``generation.unipc``) whose timesteps are the denoising steps; the velocity goes
  straight into the sampler; no noise is drawn between steps.
"""

from __future__ import annotations

import torch

from sinkscope.generation.common import PASS_DENOISE, CallInfo, FlowMatchSchedule, latents_to_device
from sinkscope.generation.loop import Block, Run, video_blocks
from sinkscope.generation.unipc import UniPCFlowSampler


class DMDSteps:
    """Self-Forcing's few-step sampler, block by block (module docstring)."""

    def __init__(self, run: Run) -> None:
        options = run.options
        self.flow = FlowMatchSchedule(options.timestep_shift, options.num_train_timesteps)
        self.units: list[Block] = video_blocks(options)
        self.timesteps = [
            self.flow.denoising_timesteps(options.block_steps(block.index), options.warp_denoising_step)
            for block in self.units
        ]
        # The re-noising draws of steps 1 .. n-1 of every block.
        self.renoise_frames = sum(block.num_frames * (len(t) - 1) for block, t in zip(self.units, self.timesteps))

    def num_steps(self, block: Block) -> int:
        return len(self.timesteps[block.index])

    def denoise(self, run: Run) -> list[torch.Tensor]:
        block, model, policy, flow, announce = run.unit, run.model, run.policy, self.flow, run.log.announce
        start, frames, device, dtype = block.start_frame, block.num_frames, run.device, run.dtype
        timesteps, context, segment = self.timesteps[block.index], run.contexts[run.segment], run.segment
        x = latents_to_device(run.noise.initial[start : start + frames], device, dtype)
        x0 = x
        for step, t in enumerate(timesteps):
            announce(CallInfo(block.index, PASS_DENOISE, step, t, start, frames, block.last, segment))
            velocity = model(
                x, torch.full((1, frames), t, device=device), context, cache_policy=policy, start_frame=start
            )
            x0 = flow.to_x0(velocity, x, t)
            if step + 1 < len(timesteps):
                fresh = latents_to_device(run.noise.renoise(frames), device, dtype)
                x = flow.add_noise(x0, fresh, timesteps[step + 1])
        run.prediction = x0
        return [x0]


class UniPCSteps:
    """LongLive 2.0's UniPC flow sampler, a new one a block (module docstring)."""

    renoise_frames = 0

    def __init__(self, run: Run) -> None:
        self.options = run.options
        self.units: list[Block] = video_blocks(run.options)

    def num_steps(self, block: Block) -> int:
        return len(self.options.denoising_steps)

    def denoise(self, run: Run) -> list[torch.Tensor]:
        block, options = run.unit, self.options
        start, frames = block.start_frame, block.num_frames
        sampler = UniPCFlowSampler(len(options.denoising_steps), options.timestep_shift, 2, options.num_train_timesteps)
        x = latents_to_device(run.noise.initial[start : start + frames], run.device, run.dtype)
        model, policy, announce, device = run.model, run.policy, run.log.announce, run.device
        context, segment = run.contexts[run.segment], run.segment
        for step, t in enumerate(sampler.timesteps.tolist()):
            announce(CallInfo(block.index, PASS_DENOISE, step, float(t), start, frames, block.last, segment))
            velocity = model(
                x, torch.full((1, frames), float(t), device=device), context, cache_policy=policy, start_frame=start
            )
            x = sampler.step(velocity, x)
        run.prediction = x
        return [x]
