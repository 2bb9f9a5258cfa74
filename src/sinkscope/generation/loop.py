"""The one generation loop; a procedure is a step rule and hooks around it.

The loop reads as Self-Forcing's ``CausalInferencePipeline.inference()`` (T2V), its steps
numbered the same way:

1. initialize the KV cache: the cache policy, sized by it (``policy_from_options``);
2. cache the context feature: T2V has no initial latent; the first call computes the
   text's cross-attention K/V, which the cache keeps;
3. the temporal denoising loop, unit by unit (a block, or Rolling Forcing's window):
   3.0 before the unit, the procedure's hooks (a prompt switch with LongLive's re-cache,
       Krea's recompute, LongLive 2.0's new shot);
   3.1 the spatial denoising loop: the procedure's step rule (DMD's few steps, UniPC, a
       rolling window), one model call a step;
   3.2 record the output of every block the unit finished (on the host, so it does not
       grow on the device);
   3.3 after the unit, the procedure's hooks (the cache pass at the context timestep,
       Krea's keeping of a frame to re-encode, LongLive 2.0's shot sink);
   3.4 the next unit starts where this one ended (the units know their frames);
4. decoding to pixels is not done here.

A ``Procedure`` declares its step rule (``StepRule``: the units and how one is denoised,
and how much noise it draws beyond the initial noise) and its hooks (``Hook`` classes:
``before_block`` and ``after_block``, run in the order declared; a class in both lists is
one object, so it may carry state from one to the other). Step rule and hooks are built
once per generation from the ``Run``, which holds what they share: the model, the
options, the policy, the noise stream, the prompt contexts and the segment in use, the
calls announced, the outputs. The step rule is built first (the noise stream is sized by
it): its ``__init__`` sees the model, the options, the latent grid, the schedule and the
prompts, not yet the policy or the noise; the hooks are built after both. All noise
comes from one seeded CPU generator (``NoiseStream``: the initial noise of every frame,
then what the step rule draws, in the order the reference draws it), so a seed gives the
same video on any device.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from sinkscope.generation.common import (
    CallInfo,
    CallLog,
    GenerationClock,
    GenerationObserver,
    GenerationResult,
    NoiseStream,
    latent_grid,
    latents_to_host,
    prompt_schedule,
)
from sinkscope.model import WanModel
from sinkscope.model.policies import CachePolicy, policy_from_options
from sinkscope.options import GenerationOptions


@dataclass(frozen=True)
class Block:
    """One block (a chunk): its index, frames, and whether it is the video's last."""

    index: int
    start_frame: int
    num_frames: int
    last: bool


def video_blocks(options: GenerationOptions) -> list[Block]:
    """The blocks of a video, in order (``GenerationOptions.block_sizes``)."""
    sizes, starts = options.block_sizes(), options.block_starts()
    return [Block(i, start, size, i == len(sizes) - 1) for i, (start, size) in enumerate(zip(starts, sizes))]


class Run:
    """One generation, as its step rule and hooks see it.

    Fixed for the run: ``model``, ``options``, ``seed``, ``vae`` (the Wan VAE when the
    procedure re-encodes frames, else None), ``device`` / ``dtype``, the latent grid
    (``height``, ``width``, ``frame_seq_length``), ``prompts`` (the context as given: an
    embedding, or a schedule whose entries may carry their text), ``schedule`` ((start
    frame, embedding) a prompt segment), ``contexts`` (the segments' embeddings on the
    device), ``policy``, ``noise``, ``steps``. Changing as it goes: ``unit`` (the block or
    window being made), ``segment`` (the prompt segment in use), ``prediction`` (the
    unit's last clean prediction on the device, what a cache pass writes), ``outputs``
    (finished blocks' latents on the host, in order).
    """

    def __init__(
        self,
        model: WanModel,
        prompts: torch.Tensor | Sequence[tuple],
        options: GenerationOptions,
        seed: int,
        observers: Iterable[GenerationObserver],
        vae: object | None,
    ) -> None:
        self.model, self.options, self.seed, self.vae = model, options, seed, vae
        self.device, self.dtype = model.device, model.dtype
        self.height, self.width, self.frame_seq_length = latent_grid(model, options)
        self.prompts = prompts
        self.schedule = prompt_schedule(prompts, options)
        self.log = CallLog(observers)
        self.outputs: list[torch.Tensor] = []
        self.segment = 0
        self.unit = None
        self.prediction: torch.Tensor | None = None
        self.steps: StepRule
        self.noise: NoiseStream
        self.policy: CachePolicy
        self.contexts: list[torch.Tensor] = []

    def announce(self, info: CallInfo) -> None:
        """Tell the observers of the model call about to run (the tables count it)."""
        self.log.announce(info)


class StepRule(Protocol):
    """How a procedure denoises (step 3.1), built once per run (``StepRule(run)``).

    ``units``: what the temporal loop goes over (``video_blocks``, or Rolling Forcing's
    windows); ``renoise_frames``: the frames of noise it draws beyond the initial noise;
    ``denoise(run)``: the calls of ``run.unit`` (announced, then made), ``run.prediction``
    set, and the latents of the blocks it finished, oldest first (on the device);
    ``num_steps(block)``: the denoising calls a block takes (``hooks.CachePass`` numbers its
    call after them; a step rule whose units are blocks defines it).
    """

    units: Sequence
    renoise_frames: int

    def __init__(self, run: Run) -> None: ...

    def denoise(self, run: Run) -> list[torch.Tensor]: ...

    def num_steps(self, block: Block) -> int: ...


class Hook(Protocol):
    """What a procedure does before and after a unit (steps 3.0 and 3.3), built once per run
    (``Hook(run)``); a hook class defines the phases it is declared for."""

    def __init__(self, run: Run) -> None: ...

    def before_block(self, run: Run) -> None: ...

    def after_block(self, run: Run) -> None: ...


@dataclass(frozen=True)
class Procedure:
    """A generation procedure: its name (a row of ``sinkscope.options.PROCEDURE_TABLE``), its
    step rule and its hooks; called with ``sampler.generate``'s signature, it runs the loop."""

    name: str
    steps: type[StepRule]
    before_block: tuple[type[Hook], ...] = ()
    after_block: tuple[type[Hook], ...] = ()

    def __post_init__(self) -> None:
        # A hook without its phase's method would fail mid-generation, after the first unit.
        for phase in ("before_block", "after_block"):
            for hook in getattr(self, phase):
                if not callable(getattr(hook, phase, None)):
                    raise ValueError(f"procedure {self.name!r}: hook {hook.__name__} has no {phase} method")

    def __call__(
        self,
        model: WanModel,
        context: torch.Tensor | Sequence[tuple],
        *,
        options: GenerationOptions,
        seed: int,
        observers: Iterable[GenerationObserver] = (),
        vae: object | None = None,
    ) -> GenerationResult:
        return generate_units(self, Run(model, context, options, seed, observers, vae))


@torch.inference_mode()
def generate_units(procedure: Procedure, run: Run) -> GenerationResult:
    """The loop (module docstring): one video's latents [1, C, F, H, W] on the CPU."""
    options, model = run.options, run.model
    run.steps = procedure.steps(run)
    run.noise = NoiseStream(
        run.seed, options.num_frames, (model.config.in_dim, run.height, run.width), run.steps.renoise_frames
    )
    # Step 1: the KV cache, sized by the policy (the cross-attention K/V come with it).
    run.policy = policy_from_options(model, options, frame_seq_length=run.frame_seq_length, seed=run.seed)
    # Step 2: no initial latent (T2V); the first call computes the text K/V.
    run.contexts = [c.to(run.device, run.dtype) for _, c in run.schedule]
    built = {hook: hook(run) for hook in (*procedure.before_block, *procedure.after_block)}
    before = [built[hook] for hook in procedure.before_block]
    after = [built[hook] for hook in procedure.after_block]
    clock = GenerationClock(run.device)
    # Step 3: the temporal denoising loop.
    for unit in run.steps.units:
        run.unit = unit
        # Step 3.0: before the unit (prompt switch and re-cache, recompute, new shot).
        for hook in before:
            hook.before_block(run)
        # Step 3.1: the spatial denoising loop.
        finished = run.steps.denoise(run)
        # Step 3.2: record the finished blocks' outputs (on the CPU).
        run.outputs.extend(latents_to_host(x0) for x0 in finished)
        # Step 3.3: after the unit (the cache pass, a frame kept to re-encode, the shot sink).
        for hook in after:
            hook.after_block(run)
        # Step 3.4: the next unit starts after this one.
    return clock.result(run.outputs, run.log, run.policy.nbytes)
