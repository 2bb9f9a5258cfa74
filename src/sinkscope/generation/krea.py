"""Krea Realtime 14B's procedure: the KV cache recomputed from a few context frames every block.

Written from the fact sheet on krea-ai/realtime-video @acf4b7b (``release_server.py``
``GenerationSession``, ``wan/modules/causal_model.py``; CC-BY-NC-SA-4.0: read for facts,
nothing of it copied). With blocks of F frames (3) and a cache of W = 2F frames:

- timesteps: the shifted flow-matching table (shift 5, one extra step) with 0 appended,
  indexed at ``krea_denoising_steps(n)`` = linspace(1000, 0, n) truncated; the last pass is
  at t = 0, whose x0 conversion and re-noising use the table's last sigma (0.00498), as
  their nearest-timestep lookup does (``FlowMatchSchedule.sigma``);
- per step the DMD rule: x0 = x_t - sigma_t v, then x_next = (1 - sigma') x0 + sigma' eps
  with fresh noise; the last step's x0 is the block's output; no cache pass;
- all noise from one seeded generator, in order: the initial noise of every frame, then the
  re-noising draws block by block (``NoiseStream``; a CPU generator here, Krea's is CUDA);
- block 0 denoises at RoPE frames 0 .. F - 1 over an empty cache;
- every later block b (first frame n = bF), in order: the context latents, the previous
  block's frames [n - F, n): for b = 1 the latents themselves, for b >= 2 the oldest
  replaced by E, the VAE re-encoding of the decoded pixel frame just before the two kept
  latents (the last pixel frame of latent n - F, 4 (n - F): the oldest of Krea's last
  1 + (F - 1) 4 decoded frames); the cache cleared; the **recompute pass**, one call over
  the context at t = 0 roped from frame 0, attending only itself; then the denoising passes
  at RoPE frames F .. 2F - 1, attending the 2F frames. Positions never grow.

``recompute_context: latent`` keeps the latent z_{n-F} instead of E (where there is no VAE:
the tests, the demo): a deviation, documented in docs/krea-realtime.md. The cache is the
policy ``krea_recompute`` (``sinkscope.model.policies.KreaRecomputePolicy``), which labels
each key by the frame it came from; the recompute call is captured as pass ``recompute``.
"""

from __future__ import annotations

from typing import Protocol

import torch

from sinkscope.generation.common import PASS_RECOMPUTE, CallInfo, latents_to_device, synchronize
from sinkscope.generation.loop import Procedure, Run
from sinkscope.generation.procedures import register_procedure
from sinkscope.generation.steps import DMDSteps
from sinkscope.model.checkpoints import ResolvedCheckpoint, find_vae, vae_candidates
from sinkscope.model.vae import TEMPORAL_STRIDE, WanVAE, load_vae
from sinkscope.options import KREA_RECOMPUTE, GenerationOptions, OptionsError, missing_reencode_vae, procedure_spec


class PixelDecoder(Protocol):
    """One video's decode, fed its latents in order (``sinkscope.model.vae.PixelStream``)."""

    def push(self, latents: torch.Tensor) -> torch.Tensor: ...


class LatentCodec(Protocol):
    """The VAE path the re-encode needs (``sinkscope.model.vae.WanVAE``): latents in the
    model's (normalized) space [1, C, F, h, w] <-> video [1, 3, T, H, W] in [-1, 1]."""

    def pixel_stream(self) -> PixelDecoder: ...

    def encode(self, frames: torch.Tensor) -> torch.Tensor: ...


def load_reencode_vae(
    checkpoint: ResolvedCheckpoint, options: GenerationOptions, device: torch.device
) -> WanVAE | None:
    """The Wan VAE of ``checkpoint`` (float32 on ``device``) when its procedure re-encodes
    frames (``ProcedureSpec.needs_vae``), else None; a missing VAE is one line naming where
    it was looked for."""
    if not procedure_spec(options.procedure).needs_vae(options):
        return None
    path = find_vae(checkpoint)
    if path is None:
        looked = ", ".join(str(p) for p in vae_candidates(checkpoint)) or "no release folder (set base)"
        raise OptionsError(
            missing_reencode_vae(
                "generation.recompute_context", f"checkpoint {checkpoint.name!r}'s", f"looked at {looked}"
            )
        )
    return load_vae(path, device=str(device), dtype="float32")


def krea_denoising_steps(num_steps: int, strength: float = 1.0) -> list[int]:
    """Krea's step indices into the schedule: linspace(1000 strength, 0, n), truncated to
    integers as torch's ``.long()`` does; with ``warp_denoising_step`` they give its
    timesteps (4 steps: 1000, 908.84, 713.98, 0; 5: 1000, 937.5, 833.33, 625, 0)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be positive, got {num_steps}")
    top = 1000.0 * strength
    values = torch.linspace(top, 0.0, num_steps) if num_steps > 1 else torch.tensor([top])
    return [int(v) for v in values.long()]


class FrameReencoder:
    """E, block after block: the last video frame of latent ``n`` (decoded from every latent
    up to it; Wan's VAE is causal, so this equals Krea's streaming decode), encoded alone.
    Each block's latents are handed over once (``add``) and decoded once, through one
    :class:`PixelDecoder`, as ``n`` grows; only those not yet decoded are kept."""

    def __init__(self, vae: LatentCodec) -> None:
        self.vae = vae
        self.stream = vae.pixel_stream()
        self.decoded = 0  # latent frames pushed
        self._waiting: list[torch.Tensor] = []  # [1, C, f, h, w] on the host, after the decoded ones

    def add(self, latents: torch.Tensor) -> None:
        """A finished block's latents [1, C, f, h, w] (on the host), in video order."""
        self._waiting.append(latents)

    def encode_frame(self, n: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """E of latent ``n`` (added, not yet decoded): one latent frame [1, C, 1, h, w] in
        ``dtype`` on ``device``."""
        waiting = torch.cat(self._waiting, dim=2) if self._waiting else None
        count = n + 1 - self.decoded
        if waiting is None or not 0 < count <= waiting.shape[2]:
            raise ValueError(f"latent {n} is not among those added and not yet decoded (from {self.decoded})")
        new, self._waiting = waiting[:, :, :count], [waiting[:, :, count:]]
        video = self.stream.push(latents_to_device(new[0].transpose(0, 1), device, dtype))
        expected = TEMPORAL_STRIDE * count - (TEMPORAL_STRIDE - 1 if self.decoded == 0 else 0)  # frame 0 decodes alone
        if video.shape[2] != expected:
            raise ValueError(f"the VAE decoded {count} latent frames to {video.shape[2]} video frames, not {expected}")
        self.decoded = n + 1
        return self.vae.encode(video[:, :, -1:]).to(device, dtype)


class RecomputedContext:
    """Krea's hook: before every block b >= 1, the cache cleared and rebuilt from the context
    frames (steps 1-3 of its ``generate_block_internal``); after every block, its latents
    kept for the context and, with ``recompute_context: reencode``, for the re-encode."""

    def __init__(self, run: Run) -> None:
        options = run.options
        self.context_frames = options.local_attn_frames - options.frames_per_block
        self.reencode = options.option("recompute_context") == "reencode"
        if run.vae is None and procedure_spec(options.procedure).needs_vae(options):
            raise OptionsError(missing_reencode_vae("generation.recompute_context", "the", "none was passed as vae"))
        self.reencoder = FrameReencoder(run.vae) if self.reencode and run.vae is not None else None
        self.previous: torch.Tensor | None = None  # the last block's x0, on the device

    def before_block(self, run: Run) -> None:
        block = run.unit
        start = block.start_frame
        if not block.index:
            return
        # 1. The context: the last frames generated, the oldest re-encoded unless it is frame 0.
        count = min(start, self.context_frames)
        first = start - count
        kept = self.previous[:, :, -count:]
        if self.reencode and first > 0:
            synchronize(run.device)  # the host copies of the finished blocks are complete
            encoded = self.reencoder.encode_frame(first, run.device, run.dtype)
            kept = torch.cat([encoded, kept[:, :, 1:]], dim=2)
        # 2.-3. The cache cleared and rebuilt: the recompute pass at t = 0, roped from frame 0.
        noise = float(run.options.context_noise)  # 0: Krea's recompute pass runs at t = 0
        run.announce(CallInfo(block.index, PASS_RECOMPUTE, 0, noise, first, count, block.last, run.segment))
        run.policy.begin_recompute(range(first, start))
        run.model(
            kept,
            torch.full((1, count), noise, device=run.device),
            run.contexts[run.segment],
            cache_policy=run.policy,
            start_frame=first,
            cache_only=True,
        )

    def after_block(self, run: Run) -> None:
        if self.reencoder is not None:
            self.reencoder.add(run.outputs[-1])
        self.previous = run.prediction


# 4. The denoising passes (the DMD steps), the block after the context in RoPE position; no cache pass.
KREA = register_procedure(
    Procedure(KREA_RECOMPUTE, DMDSteps, before_block=(RecomputedContext,), after_block=(RecomputedContext,))
)
