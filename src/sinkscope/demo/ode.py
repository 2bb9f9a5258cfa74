"""The ODE stage (CausVid / Self-Forcing's ODE initialisation): teacher trajectories
by Euler steps of the block-causal flow, the pool the student is distilled from."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sinkscope.demo import data as synthetic
from sinkscope.demo.objective import class_contexts, empty_context
from sinkscope.model import (
    WanModel,
)
from sinkscope.options import GenerationOptions


@dataclass
class OdeResult:
    latents: torch.Tensor  # [B, C, F, H, W], the ODE's end point (t = 0)
    states: torch.Tensor  # [B, len(sampler timesteps), C, F, H, W], x on the path at those timesteps


@torch.no_grad()
def ode_generate(
    model: WanModel,
    context: torch.Tensor,
    noise: torch.Tensor,
    *,
    steps: int = 32,
    options: GenerationOptions | None = None,
    autocast: torch.dtype | None = None,
    guidance: float = 1.0,
    null_context: torch.Tensor | None = None,
) -> OdeResult:
    """Block-causal generation by the flow ODE (Euler, ``steps`` per block), batched.

    The teacher's sampler for ODE distillation, and a diagnostic: what the model
    knows, free of the few-step sampler. Per block: Euler steps over the shifted
    sigmas s(u) = shift u / (1 + (shift - 1) u), u = 1 .. 0, then the cache pass at
    t = 0 on the result, as ``generate`` does. ``steps`` must be a multiple of 4 so
    that the path passes through the sampler's timesteps, where x is recorded.
    """
    options = options or GenerationOptions()
    blocks = options.block_sizes()
    denoising = [s / options.num_train_timesteps for s in options.denoising_steps]
    positions = [round((1 - u) * steps) for u in denoising]
    if any(abs((1 - u) * steps - p) > 1e-9 for u, p in zip(denoising, positions)):
        raise ValueError(f"ode steps {steps} do not pass through the sampler's timesteps {options.denoising_steps}")
    shift = options.timestep_shift
    u = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    sigmas = (shift * u / (1 + (shift - 1) * u)).tolist()
    device = model.device
    batch, _, frames_total, height, width = noise.shape
    guided = guidance != 1.0
    context = context.to(device)
    if guided:
        if null_context is None:
            raise ValueError(f"guidance {guidance} needs null_context (the empty prompt's embedding)")
        context = torch.cat([context, null_context.to(device, context.dtype).expand_as(context)])
    from sinkscope.model.policies import new_policy

    cache = new_policy(
        model,
        "global",
        frame_seq_length=model.config.frame_seq_length(height, width),
        num_frames=frames_total,
        batch_size=context.shape[0],
    )

    def both(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x]) if guided else x

    out = torch.empty(noise.shape, device=device, dtype=torch.float32)
    states = torch.empty((batch, len(positions), *noise.shape[1:]), device=device, dtype=torch.float32)
    enabled = autocast is not None and device.type == "cuda"
    start = 0
    for frames in blocks:
        x = noise[:, :, start : start + frames].to(device, torch.float32)
        for i in range(steps):
            if i in positions:
                states[:, positions.index(i), :, start : start + frames] = x
            t = torch.full((context.shape[0], frames), 1000.0 * sigmas[i], device=device)
            with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=enabled):
                v = model(both(x), t, context, cache_policy=cache, start_frame=start).float()
            if guided:
                conditional, unconditional = v.chunk(2)
                v = unconditional + guidance * (conditional - unconditional)
            x = x + (sigmas[i + 1] - sigmas[i]) * v
        out[:, :, start : start + frames] = x
        with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=enabled):
            model(
                both(x),
                torch.zeros(context.shape[0], frames, device=device),
                context,
                cache_policy=cache,
                start_frame=start,
            )
        start += frames
    return OdeResult(out, states)


def build_ode_pool(
    teacher: WanModel,
    *,
    size: int,
    seed: int,
    steps: int = 32,
    chunk: int = 256,
    autocast: torch.dtype | None = None,
    store_dtype: torch.dtype = torch.bfloat16,
    guidance: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``size`` teacher ODE trajectories: (x0 [N, C, F, H, W], states [N, 4, C, F, H, W], labels [N]).

    Classes and initial noise come from a CPU generator seeded by ``seed``; ``guidance``
    as in ``ode_generate`` (against the empty prompt).
    """
    config = teacher.config
    contexts = class_contexts(config).to(teacher.device)
    null = empty_context(config)
    generator = torch.Generator().manual_seed(int(seed))
    shape = (config.in_dim, synthetic.FRAMES, config.latent_height, config.latent_width)
    x0s, states, labels = [], [], []
    for begin in range(0, size, chunk):
        n = min(chunk, size - begin)
        label = torch.randint(len(synthetic.CLASSES), (n,), generator=generator)
        noise = torch.randn((n, *shape), generator=generator)
        result = ode_generate(
            teacher,
            contexts[label.to(teacher.device)],
            noise.to(teacher.device),
            steps=steps,
            autocast=autocast,
            guidance=guidance,
            null_context=null,
        )
        x0s.append(result.latents.to(store_dtype))
        states.append(result.states.to(store_dtype))
        labels.append(label.to(teacher.device))
    return torch.cat(x0s), torch.cat(states), torch.cat(labels)
