"""Rolling Forcing's procedure: a rolling window of blocks denoised jointly.

Written from the Rolling Forcing paper/README and the fact sheet on its code
(TencentARC/RollingForcing @a1477d0, ``pipeline/rolling_forcing_inference.py`` 170-295;
academic-only licence: nothing of it is copied here). With W = len(denoising_steps)
blocks in a window and nb blocks in the video:

- windows w = 0 .. nb + W - 2; window w holds blocks max(0, w - W + 1) .. min(nb - 1, w);
  block b sits at noise level index w - b (0 = the noisiest, t[0] = 1000), so each block
  meets every level once, one window at a time, oldest block cleanest;
- the newest block enters from the video's initial noise, the others from the previous
  window's re-noised prediction;
- **one model call per window** over all its frames, each frame at its block's
  timestep; attention is bidirectional inside the window (``RollingForcingPolicy``);
- x0 = x_t - sigma v per block; a block not at the last level is re-noised to the next
  level with its slice of a fresh draw the size of the whole window (one draw per such
  block, oldest first: their ``randn_like`` of the window's x0); a block at the last
  level is finished (its output);
- then the **cache update**: the window's first block, its x0, once more at the context
  timestep, which leaves its clean keys in the cache (during the ramp-up the first block
  is block 0, still being denoised: it is re-encoded from each window's prediction).

The tables count one call per block of a window (``pass`` denoise, ``step`` = the
block's level index, ``timestep`` its timestep) and one per cache update (``pass``
cache, ``block`` the window's first block, ``step`` = 1 + the level of the prediction
it re-encodes: W for a finished block, as Self-Forcing's cache pass; 1 .. W - 1 for
block 0's ramp-up updates, which keeps every call distinct). So a video makes
nb W + nb + W - 1 table calls and 2 (nb + W - 1) model calls. docs/cache-policies.md
lists what the paper leaves open and which choice is made here.

On the one loop of ``generation.loop``: its units are the windows, denoised by the step
rule ``RollingWindow`` (which returns the block a window finishes, if any), and the cache
update is its hook after each window (``CacheUpdate``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sinkscope.generation.common import PASS_CACHE, PASS_DENOISE, CallInfo, FlowMatchSchedule, latents_to_device
from sinkscope.generation.loop import Procedure, Run
from sinkscope.generation.procedures import register_procedure
from sinkscope.options import ROLLING_FORCING_PROCEDURE, GenerationOptions, OptionsError


@dataclass(frozen=True)
class WindowBlock:
    """One block of a window: its index, noise level index and frames."""

    block: int
    level: int
    start_frame: int
    num_frames: int


@dataclass(frozen=True)
class Window:
    """One window call: its blocks, oldest (cleanest) first."""

    index: int
    blocks: tuple[WindowBlock, ...]

    @property
    def start_frame(self) -> int:
        return self.blocks[0].start_frame

    @property
    def num_frames(self) -> int:
        return sum(b.num_frames for b in self.blocks)


class RollingSchedule:
    """Which blocks sit at which noise level in each window (RF pipeline 174-196)."""

    def __init__(self, num_blocks: int, num_levels: int, block_frames: int) -> None:
        if num_blocks < num_levels or num_levels < 1 or block_frames < 1:
            raise ValueError(f"a rolling schedule needs at least {num_levels} blocks (one per level), got {num_blocks}")
        self.num_blocks, self.num_levels, self.block_frames = num_blocks, num_levels, block_frames
        self.windows: list[Window] = []
        for w in range(num_blocks + num_levels - 1):
            first, last = max(0, w - num_levels + 1), min(num_blocks - 1, w)
            parts = tuple(WindowBlock(b, w - b, b * block_frames, block_frames) for b in range(first, last + 1))
            self.windows.append(Window(w, parts))

    def model_calls(self) -> int:
        """Model forwards: a window call and a cache update per window."""
        return 2 * len(self.windows)

    def table_calls(self) -> int:
        """Calls as the tables count them: one per block of each window, one per update."""
        return sum(len(w.blocks) for w in self.windows) + len(self.windows)

    def renoise_frames(self) -> int:
        """Frames of re-noising noise drawn: the whole window once per block not at the last level."""
        return sum(w.num_frames * sum(b.level < self.num_levels - 1 for b in w.blocks) for w in self.windows)

    def trace(self) -> list[list[tuple[int, int]]]:
        """Per window: (block, level index) oldest first; the form the tests compare."""
        return [[(b.block, b.level) for b in w.blocks] for w in self.windows]


def schedule_for(options: GenerationOptions) -> RollingSchedule:
    """The rolling schedule of ``options`` (procedure rolling_forcing)."""
    if not options.rolling_forcing:
        raise OptionsError(f"config key generation.procedure: {options.procedure!r} has no rolling window")
    return RollingSchedule(len(options.block_sizes()), len(options.denoising_steps), options.frames_per_block)


class RollingWindow:
    """Rolling Forcing's step rule: the units are the windows; a window is denoised by one
    joint call, every frame at its block's noise level (module docstring)."""

    def __init__(self, run: Run) -> None:
        options = run.options
        self.schedule = schedule_for(options)
        self.units: list[Window] = self.schedule.windows
        self.flow = FlowMatchSchedule(options.timestep_shift, options.num_train_timesteps)
        self.levels = self.flow.denoising_timesteps(options.denoising_steps, options.warp_denoising_step)
        self.renoise_frames = self.schedule.renoise_frames()
        self.noisy: dict[int, torch.Tensor] = {}  # block -> its input at its next level (device)

    def denoise(self, run: Run) -> list[torch.Tensor]:
        window, levels, flow = run.unit, self.levels, self.flow
        last_level, last_block = len(levels) - 1, self.schedule.num_blocks - 1
        # Inputs: the newest block from the initial noise, the others as re-noised last window.
        inputs = []
        for part in window.blocks:
            if part.level == 0:
                frames = run.noise.initial[part.start_frame : part.start_frame + part.num_frames]
                inputs.append(latents_to_device(frames, run.device, run.dtype))
            else:
                inputs.append(self.noisy.pop(part.block))
        x = torch.cat(inputs, dim=2)
        timesteps = torch.tensor(
            [[levels[p.level] for p in window.blocks for _ in range(p.num_frames)]], device=run.device
        )
        parts = tuple(
            CallInfo(
                p.block, PASS_DENOISE, p.level, levels[p.level], p.start_frame, p.num_frames, p.block == last_block
            )
            for p in window.blocks
        )
        first = window.blocks[0]
        run.announce(
            CallInfo(
                first.block,
                PASS_DENOISE,
                first.level,
                levels[first.level],
                window.start_frame,
                window.num_frames,
                any(p.is_last_block for p in parts),
                0,
                parts,
            )
        )
        # One joint forward over the window, every frame at its block's timestep.
        run.policy.begin_window(window.start_frame, window.num_frames)
        velocity = run.model(x, timesteps, run.contexts[0], cache_policy=run.policy, start_frame=window.start_frame)
        finished, predictions, offset = [], [], 0
        for part in window.blocks:
            frames = slice(offset, offset + part.num_frames)
            x0 = flow.to_x0(velocity[:, :, frames], x[:, :, frames], levels[part.level])
            predictions.append(x0)
            if part.level < last_level:
                # RF draws noise for the whole window and keeps this block's slice.
                fresh = run.noise.renoise(window.num_frames)[frames]
                self.noisy[part.block] = flow.add_noise(
                    x0, latents_to_device(fresh, run.device, run.dtype), levels[part.level + 1]
                )
            else:
                finished.append(x0)  # the window's oldest block, at its last level
            offset += part.num_frames
        run.prediction = predictions[0]
        return finished


class CacheUpdate:
    """After a window: its first block, its x0, once more at the context timestep, which
    leaves its clean keys in the cache (during the ramp-up block 0, still being denoised)."""

    def __init__(self, run: Run) -> None:
        self.last_block = run.steps.schedule.num_blocks - 1

    def after_block(self, run: Run) -> None:
        first = run.unit.blocks[0]
        noise = float(run.options.context_noise)
        run.announce(
            CallInfo(
                first.block,
                PASS_CACHE,
                first.level + 1,
                noise,
                first.start_frame,
                first.num_frames,
                first.block == self.last_block,
            )
        )
        run.policy.begin_cache_update(first.start_frame, first.num_frames)
        run.model(
            run.prediction,
            torch.full((1, first.num_frames), noise, device=run.device),
            None,
            cache_policy=run.policy,
            start_frame=first.start_frame,
            cache_only=True,
        )


ROLLING_FORCING = register_procedure(Procedure(ROLLING_FORCING_PROCEDURE, RollingWindow, after_block=(CacheUpdate,)))
