"""Train the demo model on the synthetic videos, and measure what it learned.

The default sinkscope config studies a ``demo`` model: the Wan2.1 architecture at a
small size. With seeded random weights its attention is near uniform and shows
nothing; this module trains that architecture on ``sinkscope.demo.data`` so a first
run shows whatever structure a trained block-causal model develops. Nothing in the
weights is planted: they start from the project's seeded random initialisation
(``sinkscope.model.wan.init_random_weights``, the same weights as the untrained
demo of that seed) and change by gradient descent on the flow-matching loss alone.

Training follows the first stage of the Self-Forcing family (CausVid's teacher
forcing / diffusion forcing of a block-causal model):

- flow matching: x_t = (1 - sigma) x0 + sigma noise, t = 1000 sigma, target
  v = noise - x0, mean-squared error;
- timesteps per block of 3 frames, drawn independently: with probability
  ``sampler_prob`` one of the sampler's four (1000, 937.5, 833.3, 625), else from
  the shifted schedule (shift 5) over (0, 1000];
- ``mode="teacher_forcing"`` (default): the sequence is the clean video (t = 0, as
  the cache pass stores it) followed by its noisy copy; a noisy block sees the clean
  blocks before it and itself, a clean block the clean blocks up to its own (the
  same positions twice, so RoPE phases match). This is exactly what KV-cache
  generation computes, with every block supervised in one forward.
  ``mode="diffusion_forcing"``: one copy, block-causal mask, each block clean
  (t = 0, unsupervised) with probability ``clean_prob`` or noisy.

Checkpoints use Self-Forcing's layout (``generator_ema`` / ``generator`` state dicts,
keys prefixed ``model.``), so ``load_transformer(path, format="self_forcing",
model="demo")`` reads them; ``sinkscope`` holds the training metadata.

Entry points: ``train_demo`` (training), ``evaluate_demo`` (samples from the real
KV-cache sampler compared with the data, against the random-weights baseline),
``export_checkpoint`` (the small file to ship), and ``python -m sinkscope.train``.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sinkscope.arguments import OneLineArgumentParser, fraction, natural, positive, positive_number, torch_device
from sinkscope.demo import data as synthetic
from sinkscope.generation.sampler import FlowMatchSchedule, block_causal_frame_mask, generate, seeded_noise
from sinkscope.io import atomic_path
from sinkscope.model import WanConfig, WanModel, build_model, get_model_config, init_random_weights
from sinkscope.model.text import demo_embedding
from sinkscope.options import GenerationOptions

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODES = ("teacher_forcing", "diffusion_forcing")
FINAL_NAME = "final.pt"
FORMAT_VERSION = 1


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
    rows = []
    for name in classes:
        emb = demo_embedding(synthetic.CLASS_PROMPTS[name], config.text_dim, config.text_len)
        rows.append(F.pad(emb, (0, 0, 0, config.text_len - emb.shape[0])))
    return torch.stack(rows)


# -- teacher forcing -------------------------------------------------------------------


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
            raise ValueError(f"teacher forcing expects 2 x {self.frames} frames from frame 0, got {frames} from {start_frame}")
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


# -- training --------------------------------------------------------------------------


@dataclass
class TrainResult:
    out_dir: Path
    final_checkpoint: Path
    checkpoints: list[Path]
    loss_log: Path
    steps: int
    seconds: float
    final_loss: float
    metadata: dict = field(default_factory=dict)
    # The trained modules in memory (EMA and raw), on the training device.
    ema_model: WanModel | None = field(default=None, repr=False)
    model: WanModel | None = field(default=None, repr=False)


class _Progress:
    """A dependency-free progress bar on stderr (one line per update when not a tty)."""

    def __init__(self, total: int, enabled: bool = True, stream=None) -> None:
        self.total = total
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.began = time.perf_counter()

    def update(self, step: int, loss: float, lr: float) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.began
        rate = elapsed / max(step, 1)
        eta = rate * (self.total - step)
        width = 24
        filled = int(width * step / max(self.total, 1))
        bar = "#" * filled + "-" * (width - filled)
        line = (
            f"train [{bar}] {step}/{self.total} loss {loss:.4f} lr {lr:.2e} "
            f"{rate:.3f} s/step {_clock(elapsed)} elapsed, {_clock(eta)} left"
        )
        if self.tty:
            self.stream.write("\r" + line + " " * 4)
            if step >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


def _state_for_saving(model: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {f"model.{k}": v.detach().to("cpu", dtype).clone() for k, v in model.state_dict().items()}


def _plain(metadata: dict) -> dict:
    """Metadata as plain JSON types, so torch.load(weights_only=True) reads the file."""
    return json.loads(json.dumps(metadata))


def save_checkpoint(
    path: str | Path,
    *,
    ema_model: torch.nn.Module,
    model: torch.nn.Module | None,
    step: int,
    metadata: dict,
    dtype: torch.dtype | str = torch.float32,
) -> Path:
    """Write a Self-Forcing-layout .pt: generator_ema (+ generator), step, sinkscope."""
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    data: dict[str, Any] = {"generator_ema": _state_for_saving(ema_model, dtype)}
    if model is not None:
        data["generator"] = _state_for_saving(model, dtype)
    data["step"] = int(step)
    data["sinkscope"] = _plain({**metadata, "step": int(step), "weights_dtype": str(dtype).removeprefix("torch.")})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        torch.save(data, tmp)
    return path


def export_checkpoint(
    source: str | Path, dest: str | Path, *, dtype: str | torch.dtype = "bfloat16", keep_generator: bool = False
) -> Path:
    """A smaller copy of a training checkpoint: generator_ema (+ generator) in ``dtype``."""
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    data = torch.load(source, map_location="cpu", weights_only=True)
    out: dict[str, Any] = {"generator_ema": {k: v.to(dtype) for k, v in data["generator_ema"].items()}}
    if keep_generator and "generator" in data:
        out["generator"] = {k: v.to(dtype) for k, v in data["generator"].items()}
    out["step"] = data.get("step", 0)
    meta = dict(data.get("sinkscope", {}))
    meta["weights_dtype"] = str(dtype).removeprefix("torch.")
    out["sinkscope"] = _plain(meta)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest) as tmp:
        torch.save(out, tmp)
    return dest


def _lr_factor(step: int, warmup: int, total: int, schedule: str, final_fraction: float) -> float:
    """LR multiplier at optimizer step ``step`` (0-based): linear warmup, then constant or cosine."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))


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
    from sinkscope.model.policies import new_policy

    cache = new_policy(model, "global", frame_seq_length=model.config.frame_seq_length(height, width),
                       num_frames=frames_total, batch_size=batch)  # fmt: skip
    context = context.to(device)
    out = torch.empty(noise.shape, device=device, dtype=torch.float32)
    states = torch.empty((batch, len(positions), *noise.shape[1:]), device=device, dtype=torch.float32)
    enabled = autocast is not None and device.type == "cuda"
    start = 0
    for frames in blocks:
        x = noise[:, :, start : start + frames].to(device, torch.float32)
        for i in range(steps):
            if i in positions:
                states[:, positions.index(i), :, start : start + frames] = x
            t = torch.full((batch, frames), 1000.0 * sigmas[i], device=device)
            with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=enabled):
                v = model(x, t, context, kv_cache=cache, start_frame=start)
            x = x + (sigmas[i + 1] - sigmas[i]) * v.float()
        out[:, :, start : start + frames] = x
        with torch.autocast(device.type, dtype=autocast or torch.bfloat16, enabled=enabled):
            model(x, torch.zeros(batch, frames, device=device), context, kv_cache=cache, start_frame=start)
        start += frames
    return OdeResult(out, states)


def build_ode_pool(
    teacher: WanModel, *, size: int, seed: int, steps: int = 32, chunk: int = 256,
    autocast: torch.dtype | None = None, store_dtype: torch.dtype = torch.bfloat16,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``size`` teacher ODE trajectories: (x0 [N, C, F, H, W], states [N, 4, C, F, H, W], labels [N]).

    Classes and initial noise come from a CPU generator seeded by ``seed``.
    """  # fmt: skip
    config = teacher.config
    contexts = class_contexts(config).to(teacher.device)
    generator = torch.Generator().manual_seed(int(seed))
    shape = (config.in_dim, synthetic.FRAMES, config.latent_height, config.latent_width)
    x0s, states, labels = [], [], []
    for begin in range(0, size, chunk):
        n = min(chunk, size - begin)
        label = torch.randint(len(synthetic.CLASSES), (n,), generator=generator)
        noise = torch.randn((n, *shape), generator=generator)
        result = ode_generate(teacher, contexts[label.to(teacher.device)], noise.to(teacher.device), steps=steps, autocast=autocast)
        x0s.append(result.latents.to(store_dtype))
        states.append(result.states.to(store_dtype))
        labels.append(label.to(teacher.device))
    return torch.cat(x0s), torch.cat(states), torch.cat(labels)


def _data_seed(seed: int, step: int, micro: int = 0) -> int:
    # Training videos come from seeds of their own range; evaluation uses others.
    return (int(seed) % (1 << 20)) * (1 << 40) + step * 16 + micro


def train_demo(
    out_dir: str | Path,
    *,
    steps: int = 2000,
    batch_size: int = 8,
    seed: int = 0,
    device: str | torch.device = "cpu",
    lr: float = 1e-3,
    ema: float = 0.995,
    save_every: int | None = None,
    warmup: int = 50,
    weight_decay: float = 0.01,
    grad_clip: float = 1.0,
    schedule: str = "cosine",
    final_lr_fraction: float = 0.1,
    mode: str = "teacher_forcing",
    stage: str = "flow",
    teacher: str | Path | None = None,
    pool_size: int = 16384,
    ode_steps: int = 32,
    ode_chunk: int = 256,
    sampler_prob: float = 0.5,
    clean_prob: float = 0.5,
    model: str | WanConfig | Mapping[str, Any] = "demo",
    init: str = "sinkscope",
    dtype: str = "bfloat16",
    checkpoint_dtype: str = "float32",
    keep_generator: bool = False,
    autocast: str | None = "auto",
    compile: bool = False,
    log_every: int = 10,
    max_seconds: float | None = None,
    progress: bool = True,
    num_threads: int | None = None,
) -> TrainResult:
    """Flow-matching training of the demo WanModel on synthetic videos.

    Writes under ``out_dir``: ``checkpoints/step_NNNNNN.pt`` every ``save_every``
    steps and at the end (generator_ema + generator in ``checkpoint_dtype``),
    ``final.pt`` (generator_ema only, or + generator with ``keep_generator``, in
    ``dtype``: bf16 keeps it ~6.6 MB), ``loss.csv`` (per ``log_every`` steps: mean
    loss, lr, gradient norm, seconds) and ``train.json`` (metadata and summary).

    ``stage="ode"`` is ODE distillation (CausVid / Self-Forcing's ODE
    initialisation): the student starts from the ``teacher`` checkpoint (a
    ``stage="flow"`` result), ``pool_size`` teacher ODE trajectories (``ode_steps``
    Euler steps a block, ``ode_generate``) are made first, and the student learns to
    map x on a trajectory at the sampler's timesteps (one per block, clean teacher
    output as context) to the trajectory's end: an x0 loss, so that the few-step
    sampler, which re-noises its x0 with fresh noise, gets samples, not means.

    The same seed and arguments give identical weights on the CPU. ``max_seconds``
    stops early (the schedule still assumes ``steps``); the step reached is
    recorded. ``autocast``: "auto" (bf16 on CUDA, off on the CPU), "bfloat16", or
    None. Host synchronisations happen only every ``log_every`` steps.
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if stage not in ("flow", "ode"):
        raise ValueError(f"stage {stage!r} is not 'flow' or 'ode'")
    if stage == "ode" and (teacher is None or mode != "teacher_forcing"):
        raise ValueError("stage 'ode' needs a teacher checkpoint and mode 'teacher_forcing'")
    if init not in ("sinkscope", "torch"):
        raise ValueError(f"init {init!r} is not 'sinkscope' or 'torch'")
    if schedule not in ("cosine", "constant"):
        raise ValueError(f"schedule {schedule!r} is not 'cosine' or 'constant'")
    if steps < 1 or batch_size < 1:
        raise ValueError("steps and batch_size must be positive")
    if num_threads:
        torch.set_num_threads(num_threads)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    out_dir = Path(out_dir)
    (out_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    config = get_model_config(model)
    if (config.latent_height, config.latent_width, config.in_dim) != (synthetic.HEIGHT, synthetic.WIDTH, synthetic.CHANNELS):
        raise ValueError(f"model {model!r} has a {config.latent_height}x{config.latent_width}x{config.in_dim} latent grid; "
                         f"the synthetic data is {synthetic.HEIGHT}x{synthetic.WIDTH}x{synthetic.CHANNELS}")
    if autocast == "auto":
        autocast = "bfloat16" if device.type == "cuda" else None
    amp_dtype = DTYPES[autocast] if autocast else None

    options = GenerationOptions()
    block_sizes = options.block_sizes()
    blocks = len(block_sizes)
    block_len = block_sizes[0]
    if len(set(block_sizes)) != 1:
        raise ValueError("training assumes equal blocks")

    # The model: the project's seeded random init (the untrained demo of this seed), or torch's.
    torch.manual_seed(seed)
    pool = None
    pool_seconds = 0.0
    teacher_training = None
    if stage == "ode":
        from sinkscope.model.loading import load_transformer

        net = load_transformer(teacher, format="self_forcing", model=config, device=device)
        pool_began = time.perf_counter()
        pool = build_ode_pool(net, size=pool_size, seed=seed, steps=ode_steps, chunk=ode_chunk, autocast=amp_dtype)
        pool_seconds = time.perf_counter() - pool_began
        init = f"teacher {Path(teacher).name}"
        teacher_training = torch.load(teacher, map_location="cpu", weights_only=True).get("sinkscope", {}).get("training")
        net = net.float().train().requires_grad_(True)
    else:
        net = WanModel(config)
        if init == "sinkscope":
            init_random_weights(net, seed)
    net = net.to(device).train()
    ema_net = copy.deepcopy(net).eval().requires_grad_(False)
    params = [p for p in net.parameters()]
    ema_params = [p for p in ema_net.parameters()]
    if compile:
        net.compile_blocks()

    # No weight decay on norms, biases and modulation tables.
    decay = [p for n, p in net.named_parameters() if p.ndim >= 2 and not n.endswith("modulation")]
    no_decay = [p for n, p in net.named_parameters() if not (p.ndim >= 2 and not n.endswith("modulation"))]
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.99), eps=1e-8, fused=fused,
    )  # fmt: skip
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: _lr_factor(s, warmup, steps, schedule, final_lr_fraction)
    )

    contexts = class_contexts(config).to(device)
    sampler_ts = torch.tensor(sampler_timesteps(options), device=device)
    tf_mask = teacher_forcing_mask(block_sizes).to(device)
    df_mask = block_causal_frame_mask(block_sizes).to(device)
    generator = torch.Generator(device=device).manual_seed(int(seed))

    metadata = {
        "format_version": FORMAT_VERSION,
        "kind": "sinkscope trained demo",
        "model": model if isinstance(model, str) else "custom",  # load with model=config when custom
        "config": config.to_dict(),
        "data": synthetic.describe(),
        "training": {
            "seed": int(seed), "steps": int(steps), "batch_size": int(batch_size), "lr": float(lr),
            "ema": float(ema), "warmup": int(warmup), "weight_decay": float(weight_decay),
            "grad_clip": float(grad_clip), "schedule": schedule, "final_lr_fraction": float(final_lr_fraction),
            "mode": mode, "sampler_prob": float(sampler_prob), "clean_prob": float(clean_prob),
            "stage": stage, "teacher": str(teacher) if teacher else None, "pool_size": int(pool_size) if pool else 0,
            "ode_steps": int(ode_steps), "pool_seconds": round(pool_seconds, 2), "teacher_training": teacher_training,
            "sampler_timesteps": [float(t) for t in sampler_ts.tolist()], "init": init,
            "autocast": autocast, "compile": bool(compile), "device": str(device),
            "torch": str(torch.__version__), "max_seconds": max_seconds,
        },
    }  # fmt: skip

    log_path = out_dir / "loss.csv"
    log_file = open(log_path, "w", newline="")
    writer = csv.writer(log_file)
    writer.writerow(["step", "loss", "lr", "grad_norm", "seconds"])
    bar = _Progress(steps, enabled=progress)
    checkpoints: list[Path] = []
    loss_sum = torch.zeros((), device=device)
    logged_since = 0
    last_loss = float("nan")
    began = time.perf_counter()
    step = 0

    def checkpoint(at: int) -> None:
        meta = {**metadata, "seconds": round(time.perf_counter() - began, 2)}
        path = out_dir / "checkpoints" / f"step_{at:06d}.pt"
        checkpoints.append(save_checkpoint(path, ema_model=ema_net, model=net, step=at, metadata=meta, dtype=checkpoint_dtype))

    try:
        while step < steps:
            if pool is None:
                batch = synthetic.synthetic_batch(_data_seed(seed, step), batch_size, device=device)
                x0, labels = batch.latents, batch.labels
                noise = torch.randn(x0.shape, generator=generator, device=device)
                t_blocks = sample_block_timesteps(
                    batch_size, blocks, generator=generator, device=device, sampler_prob=sampler_prob, sampler_ts=sampler_ts
                )
                if mode == "diffusion_forcing":
                    clean = torch.rand(batch_size, blocks, generator=generator, device=device) < clean_prob
                    t_blocks = torch.where(clean, torch.zeros_like(t_blocks), t_blocks)
                t_frames = t_blocks.repeat_interleave(block_len, dim=1)  # [B, F]
                sigma = (t_frames / 1000.0)[:, None, :, None, None]
                x_t = (1 - sigma) * x0 + sigma * noise
                target = noise - x0
                weight = None
            else:
                # ODE distillation: a point of a teacher trajectory per block -> its end.
                pool_x0, pool_states, pool_labels = pool
                index = torch.randint(len(pool_x0), (batch_size,), generator=generator, device=device)
                x0, labels = pool_x0[index].float(), pool_labels[index]
                which = torch.randint(len(sampler_ts), (batch_size, blocks), generator=generator, device=device)
                which = which.repeat_interleave(block_len, dim=1)  # [B, F]
                states = pool_states[index]  # [B, 4, C, F, H, W]
                pick = which[:, None, None, :, None, None].expand(-1, 1, *states.shape[2:])
                x_t = states.gather(1, pick).squeeze(1).float()
                t_frames = sampler_ts[which]
                sigma = (t_frames / 1000.0)[:, None, :, None, None]
                target = (x_t - x0) / sigma  # the velocity whose x0 = x_t - sigma v is the end point
                weight = sigma**2  # so the loss is the x0 error
            context = contexts[labels]
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                if mode == "teacher_forcing":
                    pred = teacher_forcing_forward(net, x0, x_t, t_frames, context, block_sizes, tf_mask)
                else:
                    pred = net(x_t, t_frames, context, frame_mask=df_mask)
            err = (pred.float() - target) ** 2
            if weight is not None:
                loss = (err * weight).mean()
            elif mode == "teacher_forcing":
                loss = err.mean()
            else:
                noisy = (t_frames > 0).float()[:, None, :, None, None].expand_as(err)
                loss = (err * noisy).sum() / noisy.sum().clamp_min(1.0)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip, foreach=True)
            optimizer.step()
            scheduler.step()
            step += 1
            # EMA with a warmup, so a short run's EMA is not the initialisation.
            decay_now = min(ema, (1 + step) / (10 + step))
            with torch.no_grad():
                torch._foreach_lerp_(ema_params, params, 1 - decay_now)
            loss_sum += loss.detach()
            logged_since += 1
            out_of_time = max_seconds is not None and time.perf_counter() - began > max_seconds
            if step % log_every == 0 or step == steps or out_of_time:
                last_loss = float(loss_sum) / logged_since
                current_lr = optimizer.param_groups[0]["lr"]
                writer.writerow([step, f"{last_loss:.6f}", f"{current_lr:.6g}", f"{float(grad_norm):.4f}",
                                 f"{time.perf_counter() - began:.2f}"])  # fmt: skip
                log_file.flush()
                bar.update(step, last_loss, current_lr)
                loss_sum.zero_()
                logged_since = 0
            if save_every and step % save_every == 0 and step < steps and not out_of_time:
                checkpoint(step)
            if out_of_time:
                break
    finally:
        log_file.close()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - began
    checkpoint(step)
    final_meta = {**metadata, "seconds": round(seconds, 2)}
    final = save_checkpoint(
        out_dir / FINAL_NAME, ema_model=ema_net, model=net if keep_generator else None,
        step=step, metadata=final_meta, dtype=dtype,
    )  # fmt: skip
    summary = {
        **final_meta,
        "steps_done": step,
        "final_loss": last_loss,
        "seconds_per_step": seconds / max(step, 1),
        "final_checkpoint": str(final),
        "checkpoints": [str(p) for p in checkpoints],
    }
    with atomic_path(out_dir / "train.json") as tmp:
        tmp.write_text(json.dumps(summary, indent=1))
    net.eval()
    return TrainResult(out_dir, final, checkpoints, log_path, step, seconds, last_loss, summary, ema_net, net)


@torch.no_grad()
def validation_loss(model: WanModel, *, batch_size: int = 8, seed: int = 1 << 61) -> float:
    """The teacher-forcing flow-matching loss on a fixed batch (fixed videos, noise and
    block timesteps cycling through the sampler's): a noise-free measure of progress."""
    options = GenerationOptions()
    block_sizes = options.block_sizes()
    device = model.device
    batch = synthetic.synthetic_batch(seed, batch_size)
    x0 = batch.latents.to(device)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(seed % (1 << 31))).to(device)
    ts = torch.tensor(sampler_timesteps(options))
    index = torch.arange(batch_size * len(block_sizes)).reshape(batch_size, -1) % len(ts)
    t_frames = ts[index].repeat_interleave(block_sizes[0], dim=1).to(device)
    sigma = (t_frames / 1000.0)[:, None, :, None, None]
    x_t = (1 - sigma) * x0 + sigma * noise
    context = class_contexts(model.config).to(device)[batch.labels.to(device)]
    pred = teacher_forcing_forward(model, x0, x_t, t_frames, context, block_sizes)
    return float(((pred.float() - (noise - x0)) ** 2).mean())


def read_loss_log(path: str | Path) -> list[dict[str, float]]:
    with open(path) as handle:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(handle)]


# -- evaluation --------------------------------------------------------------------------


def video_features(latents: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-frame measurements of videos [N, C, F, H, W] (float32, CPU).

    The "shape energy" of a pixel is its squared distance, over channels, from the
    frame's spatial mean; the centre of mass weighs pixels by energy squared (so
    the ball dominates the faint texture). ``appearance`` is the energy-weighted
    mean deviation vector (the ball's colour), for identity over time.
    """
    x = latents.float().cpu()
    n, c, f, h, w = x.shape
    dev = x - x.mean(dim=(3, 4), keepdim=True)
    energy = (dev**2).sum(1)  # [N, F, H, W]
    weight = energy**2
    total = weight.sum((2, 3)).clamp_min(1e-12)
    hh = torch.arange(h, dtype=torch.float32)
    ww = torch.arange(w, dtype=torch.float32)
    com_y = (weight.sum(3) * hh).sum(2) / total
    com_x = (weight.sum(2) * ww).sum(2) / total
    spread = (
        (weight * ((hh[:, None] - com_y[..., None, None]) ** 2 + (ww[None, :] - com_x[..., None, None]) ** 2)).sum((2, 3))
        / total
    ).sqrt()
    appearance = (dev * weight[:, None]).sum((3, 4)) / total[:, None]  # [N, C, F]
    return {
        "com_x": com_x,
        "com_y": com_y,
        "spread": spread,
        "energy": energy.mean((2, 3)),
        "peak": energy.amax((2, 3)),
        "appearance": appearance.transpose(1, 2),  # [N, F, C]
        "frame_mean": x.mean((1, 3, 4)),
        "frame_std": x.std(dim=(1, 3, 4)),
    }


def classifier_features(latents: torch.Tensor) -> torch.Tensor:
    """[N, D] motion features: trajectories, their spectra, energy and spread over time."""
    feats = video_features(latents)
    h, w = latents.shape[-2:]
    cx = feats["com_x"] / w
    cy = feats["com_y"] / h
    energy = torch.log(feats["energy"] + 1e-6)
    energy = energy - energy.mean(1, keepdim=True)
    spread = feats["spread"] / max(h, w)
    parts = [cx, cy, energy, spread]
    for series in (cx, cy, energy, spread):
        centred = series - series.mean(1, keepdim=True)
        parts.append(torch.fft.rfft(centred, dim=1).abs()[:, 1:] / series.shape[1] ** 0.5)
    return torch.cat(parts, dim=1)


@dataclass
class MotionClassifier:
    """Multinomial logistic regression on ``classifier_features`` (standardised)."""

    mean: torch.Tensor
    std: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor

    def logits(self, latents: torch.Tensor) -> torch.Tensor:
        z = (classifier_features(latents) - self.mean) / self.std
        return z @ self.weight + self.bias

    def predict(self, latents: torch.Tensor) -> torch.Tensor:
        return self.logits(latents).argmax(1)


def fit_motion_classifier(
    latents: torch.Tensor, labels: torch.Tensor, *, l2: float = 1e-3, iterations: int = 200
) -> MotionClassifier:
    feats = classifier_features(latents).double()
    mean, std = feats.mean(0), feats.std(0).clamp_min(1e-6)
    z = (feats - mean) / std
    classes = len(synthetic.CLASSES)
    weight = torch.zeros(z.shape[1], classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=iterations, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(z @ weight + bias, labels) + l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return MotionClassifier(mean.float(), std.float(), weight.detach().float(), bias.detach().float())


_EVAL_SEED = 1 << 62


def _video_metrics(latents: torch.Tensor, labels: torch.Tensor, reference: dict, classifier: MotionClassifier) -> dict:
    """Measurements of a set of videos against the data's ``reference``."""
    feats = video_features(latents)
    classes = len(synthetic.CLASSES)
    pred = classifier.predict(latents)
    confusion = torch.zeros(classes, classes, dtype=torch.long)
    for truth, guess in zip(labels.tolist(), pred.tolist()):
        confusion[truth, guess] += 1
    speed = torch.hypot(feats["com_x"].diff(dim=1), feats["com_y"].diff(dim=1)).mean(1)  # px / frame
    app = feats["appearance"]
    identity = F.cosine_similarity(app[:, 0], app[:, -1], dim=1)
    # Trajectory error: distance (px, mean over frames) to the nearest data video of the same class.
    traj = torch.stack([feats["com_x"], feats["com_y"]], dim=2)  # [N, F, 2]
    nearest = torch.empty(len(labels))
    for i, label in enumerate(labels.tolist()):
        ref = reference["trajectories"][label]
        nearest[i] = (ref - traj[i]).norm(dim=2).mean(1).min()
    frame_std = feats["frame_std"].mean(0)
    per_class = {}
    for index, name in enumerate(synthetic.CLASSES):
        rows = labels == index
        if rows.any():
            per_class[name] = {
                "accuracy": float((pred[rows] == index).float().mean()),
                "speed": float(speed[rows].mean()),
                "trajectory_error": float(nearest[rows].mean()),
                "identity": float(identity[rows].mean()),
            }
    return {
        "videos": int(len(labels)),
        "classifier_accuracy": float((pred == labels).float().mean()),
        "confusion": confusion.tolist(),
        "std": float(latents.float().std()),
        "frame_std": [round(float(v), 4) for v in frame_std],
        "frame_std_first_block": float(frame_std[:3].mean()),
        "frame_std_last_block": float(frame_std[-3:].mean()),
        "frame_std_rms_error": float((frame_std - reference["frame_std"]).pow(2).mean().sqrt()),
        "peak_energy_ratio": float(feats["peak"].mean() / reference["peak"]),
        "speed": float(speed.mean()),
        "trajectory_error": float(nearest.mean()),
        "identity": float(identity.mean()),
        "per_class": per_class,
    }


def _reference(videos_per_class: int, seed: int) -> tuple[dict, MotionClassifier, torch.Tensor, torch.Tensor]:
    classes = len(synthetic.CLASSES)
    labels = torch.arange(classes).repeat_interleave(videos_per_class)
    data = synthetic.synthetic_batch(seed, len(labels), classes=labels).latents
    classifier = fit_motion_classifier(data, labels)
    feats = video_features(data)
    traj = torch.stack([feats["com_x"], feats["com_y"]], dim=2)
    reference = {
        "frame_std": feats["frame_std"].mean(0),
        "peak": float(feats["peak"].mean()),
        "trajectories": {i: traj[labels == i] for i in range(classes)},
    }
    return reference, classifier, data, labels


def sample_videos(
    model: WanModel, *, seeds: Sequence[int], classes: Sequence[str] = synthetic.CLASSES, options: GenerationOptions | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Videos from the real KV-cache sampler for every class prompt and seed: latents, labels."""
    options = options or GenerationOptions()
    config = model.config
    videos, labels = [], []
    for name in classes:
        emb = demo_embedding(synthetic.CLASS_PROMPTS[name], config.text_dim, config.text_len)[None]
        for seed in seeds:
            videos.append(generate(model, emb, options=options, seed=int(seed)).latents.float().cpu())
            labels.append(synthetic.class_index(name))
    return torch.cat(videos), torch.tensor(labels)


def attention_summary(model: WanModel, *, seed: int = 0, classes: Sequence[str] = synthetic.CLASSES) -> dict:
    """Where the last block's queries look at the last denoising step, per layer.

    Mean attention probability mass (over heads, query frames and class prompts) on
    key frame 0, on the query's own block, on the frame 6 back, and the share of
    heads whose largest mass outside their own block is on frame 0; "uniform" is
    what each would be with equal mass on every key token. ``entropy_frames``: the
    entropy of each (prompt, head, query frame)'s key-frame distribution over ln(key
    frames), averaged: 1 = uniform over frames (as ``head_diagnostics.entropy_frames``).
    """
    from sinkscope.generation.capture import FrameStatsCapture

    options = GenerationOptions()
    config = model.config
    layers = list(range(config.num_layers))
    fsl = config.frame_seq_length()
    masses = []
    for name in classes:
        emb = demo_embedding(synthetic.CLASS_PROMPTS[name], config.text_dim, config.text_len)[None]
        with FrameStatsCapture(model, layers, frame_seq_length=fsl, backend="torch") as capture:
            generate(model, emb, options=options, seed=seed, observers=[capture])
        last_block = max(r.call.block for r in capture.records)
        last_step = len(options.denoising_steps) - 1
        per_layer = []
        for layer in layers:
            (record,) = [
                r for r in capture.records
                if r.layer == layer and r.call.block == last_block and r.call.pass_ == "denoise" and r.call.step == last_step
            ]  # fmt: skip
            per_layer.append(record.stats.prob_mass.float().cpu())  # [H, Q, K], key frames in order (global cache)
        masses.append(torch.stack(per_layer))  # [L, H, Q, K]
    per_prompt = torch.stack(masses).double()  # [C, L, H, Q, K]
    plogp = torch.where(per_prompt > 0, -per_prompt * per_prompt.clamp_min(1e-300).log(), torch.zeros_like(per_prompt))
    entropy = (plogp.sum(-1) / math.log(per_prompt.shape[-1])).mean((0, 2, 3))  # [L]
    mass = torch.stack(masses).mean(0)  # [L, H, Q=3, K=21]
    frames = mass.shape[-1]
    q0 = frames - mass.shape[2]
    own = mass[..., q0:].sum(-1)  # [L, H, Q]
    lag6 = torch.stack([mass[:, :, i, q0 + i - 6] for i in range(mass.shape[2])], dim=2)
    outside = mass[..., :q0]
    top_outside = outside.mean(2).argmax(-1)  # [L, H]
    summary = {
        "query_frames": list(range(q0, frames)),
        "uniform_per_frame": 1.0 / frames,
        "uniform_own_block": mass.shape[2] / frames,
        "layers": [],
    }
    for layer in layers:
        summary["layers"].append({
            "layer": layer,
            "frame0": float(mass[layer, :, :, 0].mean()),
            "frame0_max_head": float(mass[layer, :, :, 0].mean(1).max()),
            "own_block": float(own[layer].mean()),
            "lag6": float(lag6[layer].mean()),
            "heads_peak_on_frame0": float((top_outside[layer] == 0).float().mean()),
            "entropy_frames": float(entropy[layer]),
        })  # fmt: skip
    summary["frame_profile"] = [round(float(v), 4) for v in mass.mean((0, 1, 2))]
    return summary


def evaluate_demo(
    checkpoint_path: str | Path | None = None,
    *,
    model: WanModel | None = None,
    seeds_per_class: int = 8,
    reference_per_class: int = 200,
    baseline_seed: int | None = 0,
    attention: bool = True,
    device: str | torch.device = "cpu",
    ema: bool = True,
    ode_steps: int | None = None,
) -> dict:
    """Samples of the trained model (and of the random-weights demo) vs the data.

    Generates ``seeds_per_class`` videos per class prompt with the real KV-cache
    sampler (``GenerationOptions()`` defaults, the prompts' demo embeddings) and
    measures them as the data: per-frame std, shape energy peak, centre-of-mass
    speed and trajectory error (to the nearest data video of the class), identity
    (cosine of the ball's colour vector, first vs last frame), and the accuracy of a
    motion classifier fitted on data (chance 1/5). ``data`` holds the same numbers
    for held-out data videos (the ceiling), ``random`` for ``build_model("demo",
    seed=baseline_seed)`` (the untrained demo; None skips it). With ``ode_steps``,
    ``trained_ode`` holds the trained model's videos from the same initial noise by
    the flow ODE (``ode_generate``): a diagnostic of what the model learned, apart
    from the few-step sampler.
    """
    from sinkscope.model.loading import load_transformer

    began = time.perf_counter()
    if model is None:
        if checkpoint_path is None:
            raise ValueError("give checkpoint_path or model")
        model = load_transformer(checkpoint_path, format="self_forcing", model="demo", ema=ema, device=device)
    model = model.eval()
    reference, classifier, _, _ = _reference(reference_per_class, _EVAL_SEED)
    classes = len(synthetic.CLASSES)
    held_labels = torch.arange(classes).repeat_interleave(max(seeds_per_class, 20))
    held = synthetic.synthetic_batch(_EVAL_SEED + 1, len(held_labels), classes=held_labels).latents
    seeds = [_EVAL_SEED % 1000 + i for i in range(seeds_per_class)]
    result: dict[str, Any] = {
        "checkpoint": str(checkpoint_path) if checkpoint_path is not None else None,
        "seeds": seeds,
        "chance": 1.0 / classes,
        "classes": dict(synthetic.CLASS_PROMPTS),
        "data": _video_metrics(held, held_labels, reference, classifier),
    }
    videos, labels = sample_videos(model, seeds=seeds)
    result["trained"] = _video_metrics(videos, labels, reference, classifier)
    if ode_steps:
        options = GenerationOptions()
        config = model.config
        contexts = class_contexts(config)[labels]
        shape = (options.num_frames, config.in_dim, config.latent_height, config.latent_width)
        # generate()'s initial noise: the first num_frames frames of the seed's draw.
        noise = torch.stack([seeded_noise(seed, shape) for seed in seeds] * classes).permute(0, 2, 1, 3, 4)
        ode = ode_generate(model, contexts, noise, steps=ode_steps).latents.cpu()
        result["trained_ode"] = _video_metrics(ode, labels, reference, classifier)
        result["ode_steps"] = ode_steps
    if attention:
        result["trained"]["attention"] = attention_summary(model)
    if baseline_seed is not None:
        baseline = build_model("demo", seed=baseline_seed, device=device)
        videos, labels = sample_videos(baseline, seeds=seeds)
        result["random"] = _video_metrics(videos, labels, reference, classifier)
        if attention:
            result["random"]["attention"] = attention_summary(baseline)
    result["seconds"] = round(time.perf_counter() - began, 2)
    return result


def format_evaluation(result: dict) -> str:
    """The evaluation as a Markdown table (data / trained / random)."""
    columns = [k for k in ("data", "trained", "trained_ode", "random") if k in result]
    rows = [
        ("motion classifier accuracy (chance %.2f)" % result["chance"], "classifier_accuracy", "{:.2f}"),
        ("std of all values", "std", "{:.3f}"),
        ("frame std, first block", "frame_std_first_block", "{:.3f}"),
        ("frame std, last block", "frame_std_last_block", "{:.3f}"),
        ("frame std curve, RMS error vs data", "frame_std_rms_error", "{:.3f}"),
        ("peak shape energy / data's", "peak_energy_ratio", "{:.2f}"),
        ("centre-of-mass speed (px/frame)", "speed", "{:.2f}"),
        ("trajectory error to nearest data video (px)", "trajectory_error", "{:.2f}"),
        ("identity: colour cosine, frame 0 vs 20", "identity", "{:.2f}"),
    ]
    names = {"trained_ode": f"trained, ODE {result.get('ode_steps')} steps/block"}
    lines = ["| metric | " + " | ".join(names.get(c, c) for c in columns) + " |", "| --- |" + " ---: |" * len(columns)]
    for label, key, fmt in rows:
        lines.append(f"| {label} | " + " | ".join(fmt.format(result[c][key]) for c in columns) + " |")
    for name in synthetic.CLASSES:
        lines.append(
            f"| accuracy, {name} | " + " | ".join(f"{result[c]['per_class'][name]['accuracy']:.2f}" for c in columns) + " |"
        )
    return "\n".join(lines)


def format_attention(result: dict) -> str:
    columns = [k for k in ("trained", "random") if k in result and "attention" in result[k]]
    if not columns:
        return ""
    first = result[columns[0]]["attention"]
    lines = [
        f"Last block (query frames {first['query_frames'][0]}-{first['query_frames'][-1]}), last denoising step; "
        f"uniform: {first['uniform_per_frame']:.3f} per frame, {first['uniform_own_block']:.3f} own block.",
        "",
        "| layer | " + " | ".join(f"{c}: frame 0 | {c}: own block | {c}: lag 6 | {c}: heads peaking at frame 0 | {c}: entropy / uniform"
                                   for c in columns) + " |",  # fmt: skip
        "| --- |" + " ---: |" * (5 * len(columns)),
    ]
    for layer in range(len(first["layers"])):
        cells = []
        for c in columns:
            entry = result[c]["attention"]["layers"][layer]
            entropy = entry.get("entropy_frames")  # absent in evaluations made before it existed
            cells += [f"{entry['frame0']:.3f}", f"{entry['own_block']:.3f}", f"{entry['lag6']:.3f}", f"{entry['heads_peak_on_frame0']:.2f}",
                      "n/a" if entropy is None else f"{entropy:.3f}"]  # fmt: skip
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- command line ------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, prog: str = "python -m sinkscope.train") -> int:
    """The training command line: ``sinkscope train-demo`` and ``python -m sinkscope.train``."""
    parser = OneLineArgumentParser(
        prog=prog,
        description="Train the demo model on sinkscope's synthetic videos (and evaluate it).",
    )
    parser.add_argument("--out", required=True, help="output folder (checkpoints/, final.pt, loss.csv, train.json)")
    parser.add_argument("--steps", type=positive, default=2000, help="optimizer steps")
    parser.add_argument("--batch-size", type=positive, default=8, help="videos a step")
    parser.add_argument("--seed", type=natural, default=0, help="seed of the data, the weights and the noise")
    parser.add_argument("--device", type=torch_device, default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--lr", type=positive_number, default=1e-3, help="peak learning rate")
    parser.add_argument("--ema", type=fraction, default=0.995, help="EMA decay of the saved weights (0..1)")
    parser.add_argument("--warmup", type=natural, default=50, help="linear warm-up steps")
    parser.add_argument("--save-every", type=positive, default=None, help="save a checkpoint every N steps")
    parser.add_argument("--schedule", choices=("cosine", "constant"), default="cosine", help="learning-rate schedule")
    parser.add_argument("--mode", choices=MODES, default="teacher_forcing", help="how the context frames are noised")
    parser.add_argument("--stage", choices=("flow", "ode"), default="flow", help="flow matching, or ODE distillation of --teacher")
    parser.add_argument("--teacher", help="stage ode: the flow-matching checkpoint to distil")
    parser.add_argument("--pool-size", type=positive, default=16384, help="stage ode: teacher ODE trajectories")
    parser.add_argument("--ode-steps", type=positive, default=32, help="stage ode: Euler steps a block (a multiple of 4)")
    parser.add_argument("--ode-chunk", type=positive, default=256, help="stage ode: trajectories generated at once")
    parser.add_argument("--sampler-prob", type=fraction, default=0.5, help="share of steps at the sampler's timesteps (0..1)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16", help="weights dtype of final.pt")
    parser.add_argument("--keep-generator", action="store_true", help="final.pt also holds the non-EMA weights")
    parser.add_argument("--autocast", choices=("auto", "bfloat16", "none"), default="auto", help="mixed precision")
    parser.add_argument("--compile", action="store_true", help="torch.compile the blocks (GPU)")
    parser.add_argument("--log-every", type=positive, default=10, help="log the loss every N steps")
    parser.add_argument("--max-seconds", type=positive_number, default=None, help="stop early after this many seconds")
    parser.add_argument("--threads", type=positive, default=None, help="CPU threads")
    parser.add_argument("--evaluate", action="store_true", help="evaluate final.pt after training (eval.json)")
    parser.add_argument("--eval-seeds", type=positive, default=8, help="sampled videos per class prompt")
    parser.add_argument("--eval-ode-steps", type=positive, default=None, help="also sample by the flow ODE (diagnostic)")
    parser.add_argument("--eval-device", type=torch_device, default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--evaluate-only", metavar="CHECKPOINT", help="only evaluate this checkpoint into --out")
    args = parser.parse_args(argv)
    if args.stage == "ode" and not args.teacher and not args.evaluate_only:
        parser.error("argument --teacher: --stage ode distils a teacher; give its checkpoint")
    if args.ode_steps % 4:
        parser.error(f"argument --ode-steps: {args.ode_steps} is not a multiple of 4")
    for option, path in (("--teacher", args.teacher), ("--evaluate-only", args.evaluate_only)):
        if path and not Path(path).is_file():
            parser.error(f"argument {option}: {path!r} does not exist")
    if args.device.startswith("cuda") or args.eval_device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            parser.error("argument --device: CUDA is not available here")
    out = Path(args.out)
    if args.evaluate_only:
        checkpoint = Path(args.evaluate_only)
    else:
        result = train_demo(
            out, steps=args.steps, batch_size=args.batch_size, seed=args.seed, device=args.device, lr=args.lr,
            ema=args.ema, warmup=args.warmup, save_every=args.save_every, schedule=args.schedule, mode=args.mode,
            sampler_prob=args.sampler_prob, dtype=args.dtype, stage=args.stage, teacher=args.teacher,
            pool_size=args.pool_size, ode_steps=args.ode_steps, ode_chunk=args.ode_chunk, keep_generator=args.keep_generator,
            autocast=None if args.autocast == "none" else args.autocast, compile=args.compile,
            log_every=args.log_every, max_seconds=args.max_seconds, num_threads=args.threads,
        )  # fmt: skip
        print(f"trained {result.steps} steps in {result.seconds:.1f} s; final loss {result.final_loss:.4f}; {result.final_checkpoint}")
        checkpoint = result.final_checkpoint
        if not args.evaluate:
            return 0
    evaluation = evaluate_demo(
        checkpoint, seeds_per_class=args.eval_seeds, ode_steps=args.eval_ode_steps, device=args.eval_device
    )
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "eval.json") as tmp:
        tmp.write_text(json.dumps(evaluation, indent=1))
    print(format_evaluation(evaluation))
    print()
    print(format_attention(evaluation))
    return 0


if __name__ == "__main__":
    sys.exit(main())
