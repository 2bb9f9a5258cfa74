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
  ``mode="bidirectional"``: one copy, full attention, one timestep per video: how
  Wan2.1 itself is trained, the pretraining that CausVid and Self-Forcing start
  their block-causal models from (``init_from`` then starts a teacher-forcing run
  from its weights).

Checkpoints use Self-Forcing's layout (``generator_ema`` / ``generator`` state dicts,
keys prefixed ``model.``), so ``load_transformer(path, format="self_forcing",
model="demo")`` reads them; ``sinkscope`` holds the training metadata.

Entry points: ``train_demo`` (training), ``evaluate_demo`` (samples from the real
KV-cache sampler compared with the data, against the random-weights baseline),
``export_checkpoint`` (the small file to ship), and ``python -m sinkscope.demo.train``.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
import pickle
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sinkscope.arguments import (
    OUTPUT_RULE,
    OneLineArgumentParser,
    fraction,
    natural,
    output_folder,
    positive,
    positive_number,
    torch_checkpoint,
    torch_device,
)
from sinkscope.demo import data as synthetic
from sinkscope.demo.batches import batch_loss, flow_batch, ode_batch
from sinkscope.demo.evaluation import evaluate_demo, format_attention, format_evaluation
from sinkscope.demo.objective import (
    MODES,
    class_contexts,
    empty_context,
    sampler_timesteps,
    teacher_forcing_mask,
)
from sinkscope.demo.ode import build_ode_pool
from sinkscope.demo.saving import DTYPES, FINAL_NAME, FORMAT_VERSION, save_checkpoint
from sinkscope.errors import SinkscopeError
from sinkscope.generation.sampler import (
    block_causal_frame_mask,
)
from sinkscope.io import atomic_path
from sinkscope.model import (
    WanConfig,
    WanModel,
    get_model_config,
    init_random_weights,
)
from sinkscope.options import GenerationOptions


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


def _lr_factor(step: int, warmup: int, total: int, schedule: str, final_fraction: float) -> float:
    """LR multiplier at optimizer step ``step`` (0-based): linear warmup, then constant or cosine."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run is given besides its output folder; checked on creation."""

    steps: int = 2000
    batch_size: int = 8
    seed: int = 0
    device: str = "cpu"
    lr: float = 1e-3
    ema: float = 0.995
    save_every: int | None = None
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    schedule: str = "cosine"  # or "constant"
    final_lr_fraction: float = 0.1
    mode: str = "teacher_forcing"  # or "diffusion_forcing", "bidirectional"
    stage: str = "flow"  # or "ode": distil ``teacher``
    teacher: str | None = None
    pool_size: int = 16384
    ode_steps: int = 32
    ode_chunk: int = 256
    sampler_prob: float = 0.5
    clean_prob: float = 0.5
    # The share of training videos whose prompt is the empty one (the flow stage), so the
    # model also learns the unconditional flow that classifier-free guidance needs; and
    # the guidance scale of the teacher's ODE trajectories (the ODE stage; 1 = none).
    cond_dropout: float = 0.0
    guidance: float = 1.0
    # The data (sinkscope.demo.data): latent frame 0 an image latent or like the others,
    # and the video frames a later latent frame averages (4: Wan's VAE; "video" and 1
    # give data version 1's videos).
    first_frame: str = "image"
    temporal_compression: int = synthetic.TEMPORAL_COMPRESSION
    grain: float = 0.0
    # Further synthetic_batch options: scale, and for experiments fine_texture, image_offset, image_gain.
    data_extra: Mapping[str, float] = field(default_factory=dict)
    model: str | WanConfig | Mapping[str, Any] = "demo"
    init: str = "sinkscope"  # or "torch"
    init_from: str | None = None  # a checkpoint whose EMA weights the flow stage starts from
    dtype: str = "bfloat16"
    checkpoint_dtype: str = "float32"
    keep_generator: bool = False
    autocast: str | None = "auto"
    compile: bool = False
    log_every: int = 10
    max_seconds: float | None = None
    # Stop after this step, the schedule still that of ``steps``, and write state.pt; resume
    # continues from such a file: a long run split over several GPU calls or sessions.
    stop_at: int | None = None
    resume: str | None = None
    progress: bool = True
    num_threads: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.stage not in ("flow", "ode"):
            raise ValueError(f"stage {self.stage!r} is not 'flow' or 'ode'")
        if self.stage == "ode" and (self.teacher is None or self.mode != "teacher_forcing"):
            raise ValueError("stage 'ode' needs a teacher checkpoint and mode 'teacher_forcing'")
        if self.init_from is not None and self.stage == "ode":
            raise ValueError("init_from is for stage 'flow'; stage 'ode' starts from its teacher")
        if self.init not in ("sinkscope", "torch"):
            raise ValueError(f"init {self.init!r} is not 'sinkscope' or 'torch'")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"schedule {self.schedule!r} is not 'cosine' or 'constant'")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch_size must be positive")
        if self.first_frame not in synthetic.FIRST_FRAME_STYLES:
            raise ValueError(
                f"first_frame {self.first_frame!r} is not one of {', '.join(synthetic.FIRST_FRAME_STYLES)}"
            )
        if self.temporal_compression < 1:
            raise ValueError("temporal_compression must be at least 1")
        if self.grain < 0:
            raise ValueError("grain must be >= 0")
        if not 0.0 <= self.cond_dropout < 1.0:
            raise ValueError(f"cond_dropout {self.cond_dropout} is not in [0, 1)")
        if self.guidance <= 0:
            raise ValueError(f"guidance {self.guidance} must be > 0 (1 = no guidance)")
        if self.stop_at is not None and not 1 <= self.stop_at <= self.steps:
            raise ValueError(f"stop_at {self.stop_at} is not a step of this run (1..{self.steps})")

    def data_options(self) -> dict[str, Any]:
        """The keyword arguments of ``synthetic_batch`` that pick this run's data."""
        return {
            "first_frame": self.first_frame,
            "temporal_compression": int(self.temporal_compression),
            "grain": float(self.grain),
            **{k: float(v) for k, v in self.data_extra.items()},
        }


STATE_NAME = "state.pt"
# What a resumed run must share with the run that wrote its state (the rest, such as the
# device's speed, compile, max_seconds or stop_at, may change between the parts).
_RUN_KEYS = (
    "seed",
    "steps",
    "batch_size",
    "lr",
    "ema",
    "warmup",
    "weight_decay",
    "grad_clip",
    "schedule",
    "final_lr_fraction",
    "mode",
    "sampler_prob",
    "clean_prob",
    "cond_dropout",
    "guidance",
    "stage",
    "teacher",
    "pool_size",
    "ode_steps",
    "init",
    "init_from",
    "autocast",
)


def _run_identity(metadata: dict) -> dict:
    """What a resumed run must share with its state's run, as plain JSON types (as stored)."""
    training = metadata["training"]
    return json.loads(
        json.dumps({"model": metadata["config"], "data": metadata["data"], **{key: training[key] for key in _RUN_KEYS}})
    )


def _save_state(path: Path, *, net, ema_net, optimizer, scheduler, generator, step: int, metadata: dict) -> Path:
    """Everything a run needs to go on exactly where it stopped, in float32."""
    state = {
        "step": int(step),
        "device_type": generator.device.type,
        "run": _run_identity(metadata),
        "generator": {k: v.detach().cpu() for k, v in net.state_dict().items()},
        "generator_ema": {k: v.detach().cpu() for k, v in ema_net.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": generator.get_state(),
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return path


def _load_state(path: str | Path, metadata: dict, device: torch.device) -> dict:
    """A state.pt for this run, checked: one-line errors name the file and what differs."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
        raise ValueError(f"resume: {path} is not a training state ({str(error).splitlines()[0][:120]})") from None
    if not isinstance(state, dict) or "run" not in state or "optimizer" not in state:
        raise ValueError(
            f"resume: {path} is not a training state (state.pt of a run stopped by stop_at or max_seconds)"
        )
    for key, value in _run_identity(metadata).items():
        if state["run"].get(key) != value:
            raise ValueError(
                f"resume: {path} was trained with {key} = {state['run'].get(key)!r}, this run has {value!r}"
            )
    if state["device_type"] != device.type:
        raise ValueError(
            f"resume: {path} was trained on {state['device_type']}; resume it there (its random state is "
            f"the {state['device_type']} generator's), not on {device.type}"
        )
    return state


@dataclass
class _Start:
    """What a run starts from: the model, and for stage 'ode' the teacher's trajectories
    (with what the metadata records of them)."""

    net: WanModel
    init: str  # 'sinkscope', 'torch', 'checkpoint <file>' or 'teacher <file>'
    data: dict  # the data set's describe() record
    pool: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    pool_seconds: float = 0.0
    teacher_training: dict | None = None


def _checked_model(config: TrainConfig) -> WanConfig:
    """The model config, refused unless its latent grid is the synthetic data's."""
    model_config = get_model_config(config.model)
    if (model_config.latent_height, model_config.latent_width, model_config.in_dim) != (
        synthetic.HEIGHT,
        synthetic.WIDTH,
        synthetic.CHANNELS,
    ):
        raise ValueError(
            f"model {config.model!r} has a "
            f"{model_config.latent_height}x{model_config.latent_width}x{model_config.in_dim} latent grid; the "
            f"synthetic data is {synthetic.HEIGHT}x{synthetic.WIDTH}x{synthetic.CHANNELS}"
        )
    return model_config


def _starting_model(
    config: TrainConfig, model_config: WanConfig, device: torch.device, amp_dtype: torch.dtype | None
) -> _Start:
    """The model training starts from: stage 'ode', the teacher (and the pool of its ODE
    trajectories, whose data the student then learns); ``init_from``, that checkpoint's
    EMA weights; else the project's seeded random init (the untrained demo of this seed)
    or torch's."""
    from sinkscope.model.loading import load_transformer

    torch.manual_seed(config.seed)
    data = synthetic.describe(**config.data_options())
    if config.stage == "ode":
        net = load_transformer(config.teacher, format="self_forcing", model=model_config, device=device)
        began = time.perf_counter()
        pool = build_ode_pool(
            net,
            size=config.pool_size,
            seed=config.seed,
            steps=config.ode_steps,
            chunk=config.ode_chunk,
            autocast=amp_dtype,
            guidance=config.guidance,
        )
        seconds = time.perf_counter() - began
        teacher = torch.load(config.teacher, map_location="cpu", weights_only=True).get("sinkscope", {})
        # The student learns the teacher's videos, so its data is the teacher's (evaluate_demo reads it).
        return _Start(
            net.float().train().requires_grad_(True),
            f"teacher {Path(config.teacher).name}",
            teacher.get("data", data),
            pool,
            seconds,
            teacher.get("training"),
        )
    if config.init_from:
        net = load_transformer(config.init_from, format="self_forcing", model=model_config, device=device).float()
        return _Start(net, f"checkpoint {Path(config.init_from).name}", data)
    net = WanModel(model_config)
    if config.init == "sinkscope":
        init_random_weights(net, config.seed)
    return _Start(net, config.init, data)


def _optimizer(net: WanModel, config: TrainConfig, device: torch.device):
    """AdamW without weight decay on norms, biases and modulation tables, and the
    learning-rate schedule (linear warm-up, then constant or cosine)."""
    decay = [p for n, p in net.named_parameters() if p.ndim >= 2 and not n.endswith("modulation")]
    no_decay = [p for n, p in net.named_parameters() if not (p.ndim >= 2 and not n.endswith("modulation"))]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(0.9, 0.99),
        eps=1e-8,
        fused=device.type == "cuda",
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: _lr_factor(s, config.warmup, config.steps, config.schedule, config.final_lr_fraction)
    )
    return optimizer, scheduler


def _metadata(
    config: TrainConfig,
    model_config: WanConfig,
    start: _Start,
    sampler_ts: torch.Tensor,
    autocast: str | None,
    device: torch.device,
) -> dict:
    """What the checkpoints and train.json record of the run."""
    return {
        "format_version": FORMAT_VERSION,
        "kind": "sinkscope trained demo",
        "model": config.model if isinstance(config.model, str) else "custom",  # load with model=config when custom
        "config": model_config.to_dict(),
        "data": start.data,
        "training": {
            "seed": int(config.seed),
            "steps": int(config.steps),
            "batch_size": int(config.batch_size),
            "lr": float(config.lr),
            "ema": float(config.ema),
            "warmup": int(config.warmup),
            "weight_decay": float(config.weight_decay),
            "grad_clip": float(config.grad_clip),
            "schedule": config.schedule,
            "final_lr_fraction": float(config.final_lr_fraction),
            "mode": config.mode,
            "sampler_prob": float(config.sampler_prob),
            "clean_prob": float(config.clean_prob),
            "cond_dropout": float(config.cond_dropout),
            "guidance": float(config.guidance),
            "stage": config.stage,
            "teacher": str(config.teacher) if config.teacher else None,
            "pool_size": int(config.pool_size) if start.pool else 0,
            "ode_steps": int(config.ode_steps),
            "pool_seconds": round(start.pool_seconds, 2),
            "teacher_training": start.teacher_training,
            "sampler_timesteps": [float(t) for t in sampler_ts.tolist()],
            "init": start.init,
            "init_from": str(config.init_from) if config.init_from else None,
            "autocast": autocast,
            "compile": bool(config.compile),
            "device": str(device),
            "torch": str(torch.__version__),
            "max_seconds": config.max_seconds,
        },
    }


class _LossLog:
    """loss.csv: every ``log_every`` steps the mean loss since the last row, the learning
    rate, the gradient norm and the seconds; continued when a run resumes. The loss is
    summed on the device and read back only when a row is written."""

    def __init__(self, path: Path, *, appending: bool, device: torch.device, bar: _Progress) -> None:
        self.path = path
        self.file = open(path, "a" if appending else "w", newline="")
        self.writer = csv.writer(self.file)
        if not appending:
            self.writer.writerow(["step", "loss", "lr", "grad_norm", "seconds"])
        self.bar = bar
        self.total = torch.zeros((), device=device)
        self.count = 0
        self.last = float("nan")

    def add(self, loss: torch.Tensor) -> None:
        self.total += loss.detach()
        self.count += 1

    def write(self, step: int, lr: float, grad_norm: torch.Tensor, seconds: float) -> None:
        self.last = float(self.total) / self.count
        self.writer.writerow([step, f"{self.last:.6f}", f"{lr:.6g}", f"{float(grad_norm):.4f}", f"{seconds:.2f}"])
        self.file.flush()
        self.bar.update(step, self.last, lr)
        self.total.zero_()
        self.count = 0

    def close(self) -> None:
        self.file.close()


def train_demo(out_dir: str | Path, config: TrainConfig | None = None, **fields: Any) -> TrainResult:
    """Flow-matching training of the demo WanModel on synthetic videos: ``config`` (a
    ``TrainConfig``), with ``fields`` replacing its values.

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
    and ``stop_at`` stop early (the schedule still assumes ``steps``); the step reached
    is recorded, and ``state.pt`` (weights, EMA, optimizer, schedule and random state in
    float32) lets ``resume`` go on from it: on the CPU, a run stopped and resumed gives
    the weights of the same run in one go, bit for bit. ``autocast``: "auto" (bf16 on
    CUDA, off on the CPU), "bfloat16", or None. Host synchronisations happen only every
    ``log_every`` steps.
    """
    config = dataclasses.replace(config or TrainConfig(), **fields)
    device = torch.device(config.device)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    out_dir = Path(out_dir)
    (out_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    model_config = _checked_model(config)
    autocast = ("bfloat16" if device.type == "cuda" else None) if config.autocast == "auto" else config.autocast
    amp_dtype = DTYPES[autocast] if autocast else None
    block_sizes = GenerationOptions().block_sizes()
    if len(set(block_sizes)) != 1:
        raise ValueError("training assumes equal blocks")

    start = _starting_model(config, model_config, device, amp_dtype)
    net = start.net.to(device).train().requires_grad_(True)
    ema_net = copy.deepcopy(net).eval().requires_grad_(False)
    params, ema_params = list(net.parameters()), list(ema_net.parameters())
    optimizer, scheduler = _optimizer(net, config, device)
    contexts = class_contexts(model_config).to(device)
    null_context = empty_context(model_config).to(device)
    sampler_ts = torch.tensor(sampler_timesteps(), device=device)
    masks = {
        "teacher_forcing": teacher_forcing_mask(block_sizes).to(device),
        "diffusion_forcing": block_causal_frame_mask(block_sizes).to(device),
    }
    generator = torch.Generator(device=device).manual_seed(int(config.seed))
    metadata = _metadata(config, model_config, start, sampler_ts, autocast, device)

    step = 0
    if config.resume:
        state = _load_state(config.resume, metadata, device)
        net.load_state_dict(state["generator"])
        ema_net.load_state_dict(state["generator_ema"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        generator.set_state(state["rng"])
        step = int(state["step"])
        metadata["training"]["resumed_from"] = {"state": str(config.resume), "step": step}
    if config.compile:
        net.compile_blocks()
    stop = config.stop_at or config.steps

    log = _LossLog(
        out_dir / "loss.csv",
        appending=bool(config.resume) and (out_dir / "loss.csv").exists(),
        device=device,
        bar=_Progress(config.steps, enabled=config.progress),
    )
    checkpoints: list[Path] = []
    began = time.perf_counter()

    def checkpoint(at: int) -> None:
        meta = {**metadata, "seconds": round(time.perf_counter() - began, 2)}
        path = out_dir / "checkpoints" / f"step_{at:06d}.pt"
        checkpoints.append(
            save_checkpoint(path, ema_model=ema_net, model=net, step=at, metadata=meta, dtype=config.checkpoint_dtype)
        )

    try:
        while step < stop:
            if start.pool is None:
                batch = flow_batch(config, step, generator, sampler_ts, block_sizes)
            else:
                batch = ode_batch(config, start.pool, generator, sampler_ts, block_sizes)
            context = contexts[batch.labels]
            if config.cond_dropout > 0 and start.pool is None:  # drawn only then, so runs without it are unchanged
                dropped = torch.rand(config.batch_size, generator=generator, device=device) < config.cond_dropout
                context = torch.where(dropped[:, None, None], null_context, context)
            loss = batch_loss(
                net, batch, context, config.mode, block_sizes=block_sizes, masks=masks, amp_dtype=amp_dtype
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip, foreach=True)
            optimizer.step()
            scheduler.step()
            step += 1
            # EMA with a warmup, so a short run's EMA is not the initialisation.
            decay_now = min(config.ema, (1 + step) / (10 + step))
            with torch.no_grad():
                torch._foreach_lerp_(ema_params, params, 1 - decay_now)
            log.add(loss)
            out_of_time = config.max_seconds is not None and time.perf_counter() - began > config.max_seconds
            if step % config.log_every == 0 or step == stop or out_of_time:
                log.write(step, optimizer.param_groups[0]["lr"], grad_norm, time.perf_counter() - began)
            if config.save_every and step % config.save_every == 0 and step < stop and not out_of_time:
                checkpoint(step)
            if out_of_time:
                break
    finally:
        log.close()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - began
    checkpoint(step)
    return _finish(
        out_dir, config, metadata, net, ema_net, optimizer, scheduler, generator, step, seconds, log, checkpoints
    )


def _finish(
    out_dir: Path,
    config: TrainConfig,
    metadata: dict,
    net: WanModel,
    ema_net: WanModel,
    optimizer,
    scheduler,
    generator: torch.Generator,
    step: int,
    seconds: float,
    log: _LossLog,
    checkpoints: list[Path],
) -> TrainResult:
    """After the last step: state.pt when the run stopped early (to resume from), final.pt,
    train.json (the metadata and the summary), and the result."""
    state_path = None
    if step < config.steps:
        state_path = _save_state(
            out_dir / STATE_NAME,
            net=net,
            ema_net=ema_net,
            optimizer=optimizer,
            scheduler=scheduler,
            generator=generator,
            step=step,
            metadata=metadata,
        )
    final_meta = {**metadata, "seconds": round(seconds, 2)}
    final = save_checkpoint(
        out_dir / FINAL_NAME,
        ema_model=ema_net,
        model=net if config.keep_generator else None,
        step=step,
        metadata=final_meta,
        dtype=config.dtype,
    )
    summary = {
        **final_meta,
        "steps_done": step,
        "final_loss": log.last,
        "seconds_per_step": seconds / max(step, 1),
        "final_checkpoint": str(final),
        "checkpoints": [str(p) for p in checkpoints],
        "state": str(state_path) if state_path else None,
    }
    with atomic_path(out_dir / "train.json") as tmp:
        tmp.write_text(json.dumps(summary, indent=1))
    net.eval()
    return TrainResult(out_dir, final, checkpoints, log.path, step, seconds, log.last, summary, ema_net, net)


def read_loss_log(path: str | Path) -> list[dict[str, float]]:
    with open(path) as handle:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def main(argv: Sequence[str] | None = None, prog: str = "python -m sinkscope.demo.train") -> int:
    """The training command line: ``sinkscope train-demo`` and ``python -m sinkscope.demo.train``."""
    defaults = TrainConfig()
    parser = OneLineArgumentParser(
        prog=prog,
        description="Train the demo model on sinkscope's synthetic videos (and evaluate it).",
    )
    parser.add_argument(
        "--out",
        required=True,
        type=output_folder,
        help=f"output folder (checkpoints/, final.pt, loss.csv, train.json); {OUTPUT_RULE}",
    )
    parser.add_argument("--steps", type=positive, default=defaults.steps, help="optimizer steps")
    parser.add_argument("--batch-size", type=positive, default=defaults.batch_size, help="videos a step")
    parser.add_argument(
        "--seed", type=natural, default=defaults.seed, help="seed of the data, the weights and the noise"
    )
    parser.add_argument("--device", type=torch_device, default=defaults.device, help="cpu, cuda or cuda:N")
    parser.add_argument("--lr", type=positive_number, default=defaults.lr, help="peak learning rate")
    parser.add_argument("--ema", type=fraction, default=defaults.ema, help="EMA decay of the saved weights (0..1)")
    parser.add_argument("--warmup", type=natural, default=defaults.warmup, help="linear warm-up steps")
    parser.add_argument(
        "--save-every", type=positive, default=defaults.save_every, help="save a checkpoint every N steps"
    )
    parser.add_argument(
        "--schedule", choices=("cosine", "constant"), default=defaults.schedule, help="learning-rate schedule"
    )
    parser.add_argument(
        "--weight-decay", type=fraction, default=defaults.weight_decay, help="AdamW weight decay of the matrices"
    )
    parser.add_argument(
        "--cond-dropout",
        type=fraction,
        default=defaults.cond_dropout,
        help="share of training videos given the empty prompt (0..1; for guidance)",
    )
    parser.add_argument("--mode", choices=MODES, default=defaults.mode, help="how the context frames are noised")
    parser.add_argument(
        "--stage",
        choices=("flow", "ode"),
        default=defaults.stage,
        help="flow matching, or ODE distillation of --teacher",
    )
    parser.add_argument("--teacher", help="stage ode: the flow-matching checkpoint to distil")
    parser.add_argument(
        "--init-from", metavar="CHECKPOINT", help="stage flow: start from this checkpoint's EMA weights"
    )
    parser.add_argument(
        "--pool-size", type=positive, default=defaults.pool_size, help="stage ode: teacher ODE trajectories"
    )
    parser.add_argument(
        "--ode-steps",
        type=positive,
        default=defaults.ode_steps,
        help="stage ode: Euler steps a block (a multiple of 4)",
    )
    parser.add_argument(
        "--ode-chunk", type=positive, default=defaults.ode_chunk, help="stage ode: trajectories generated at once"
    )
    parser.add_argument(
        "--guidance",
        type=positive_number,
        default=defaults.guidance,
        help="stage ode: classifier-free guidance of the teacher's trajectories (1 = none)",
    )
    parser.add_argument(
        "--first-frame",
        choices=synthetic.FIRST_FRAME_STYLES,
        default=defaults.first_frame,
        help="data: latent frame 0 an image latent (Wan's VAE) or like the others",
    )
    parser.add_argument(
        "--temporal-compression",
        type=positive,
        default=defaults.temporal_compression,
        help="data: video frames a later latent frame averages (1 and --first-frame video: data version 1)",
    )
    parser.add_argument(
        "--data-scale",
        type=positive_number,
        default=None,
        help=(
            f"data: divide the raw values by this (default {synthetic.DATA_SCALE}; data version 1: "
            f"{synthetic.VERSION1_SCALE})"
        ),
    )
    parser.add_argument(
        "--grain", type=float, default=defaults.grain, help="data: per-pixel detail of every video frame (raw units)"
    )
    parser.add_argument(
        "--fine-texture",
        type=float,
        default=0.0,
        help="data: a static per-pixel background texture (raw units; the default demo: 0.5)",
    )
    parser.add_argument(
        "--sampler-prob",
        type=fraction,
        default=defaults.sampler_prob,
        help="share of steps at the sampler's timesteps (0..1)",
    )
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=defaults.dtype, help="weights dtype of final.pt")
    parser.add_argument("--keep-generator", action="store_true", help="final.pt also holds the non-EMA weights")
    parser.add_argument("--autocast", choices=("auto", "bfloat16", "none"), default="auto", help="mixed precision")
    parser.add_argument("--compile", action="store_true", help="torch.compile the blocks (GPU)")
    parser.add_argument("--log-every", type=positive, default=defaults.log_every, help="log the loss every N steps")
    parser.add_argument(
        "--max-seconds", type=positive_number, default=defaults.max_seconds, help="stop early after this many seconds"
    )
    parser.add_argument(
        "--stop-at",
        type=positive,
        default=None,
        help="stop after this step (the schedule stays --steps'); writes state.pt",
    )
    parser.add_argument("--resume", metavar="STATE", help="go on from a state.pt of the same run (same arguments)")
    parser.add_argument("--threads", type=positive, default=None, help="CPU threads")
    parser.add_argument("--evaluate", action="store_true", help="evaluate final.pt after training (eval.json)")
    parser.add_argument("--eval-seeds", type=positive, default=8, help="sampled videos per class prompt")
    parser.add_argument(
        "--eval-ode-steps", type=positive, default=None, help="also sample by the flow ODE (diagnostic)"
    )
    parser.add_argument(
        "--eval-ode-guidance", type=positive_number, default=1.0, help="classifier-free guidance of that ODE (1 = none)"
    )
    parser.add_argument("--eval-device", type=torch_device, default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument(
        "--evaluate-only",
        metavar="CHECKPOINT",
        type=torch_checkpoint,
        help="only evaluate this .pt checkpoint (a train-demo run's final.pt) into --out/eval.json",
    )
    args = parser.parse_args(argv)
    if args.stage == "ode" and not args.teacher and not args.evaluate_only:
        parser.error("argument --teacher: --stage ode distils a teacher; give its checkpoint")
    if args.ode_steps % 4:
        parser.error(f"argument --ode-steps: {args.ode_steps} is not a multiple of 4")
    for option, path in (
        ("--teacher", args.teacher),
        ("--init-from", args.init_from),
        ("--evaluate-only", args.evaluate_only),
        ("--resume", args.resume),
    ):
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
        data_extra = {"scale": args.data_scale} if args.data_scale is not None else {}
        if args.fine_texture:
            data_extra["fine_texture"] = args.fine_texture
        config = TrainConfig(
            steps=args.steps,
            batch_size=args.batch_size,
            seed=args.seed,
            device=args.device,
            lr=args.lr,
            ema=args.ema,
            warmup=args.warmup,
            save_every=args.save_every,
            schedule=args.schedule,
            mode=args.mode,
            sampler_prob=args.sampler_prob,
            weight_decay=args.weight_decay,
            cond_dropout=args.cond_dropout,
            guidance=args.guidance,
            first_frame=args.first_frame,
            temporal_compression=args.temporal_compression,
            grain=args.grain,
            data_extra=data_extra,
            dtype=args.dtype,
            stage=args.stage,
            teacher=args.teacher,
            pool_size=args.pool_size,
            ode_steps=args.ode_steps,
            ode_chunk=args.ode_chunk,
            keep_generator=args.keep_generator,
            autocast=None if args.autocast == "none" else args.autocast,
            compile=args.compile,
            log_every=args.log_every,
            max_seconds=args.max_seconds,
            num_threads=args.threads,
            stop_at=args.stop_at,
            resume=args.resume,
            init_from=args.init_from,
        )
        try:
            result = train_demo(out, config)
        except ValueError as error:
            parser.error(str(error))
        print(
            f"trained {result.steps} steps in {result.seconds:.1f} s; final loss {result.final_loss:.4f}; "
            f"{result.final_checkpoint}"
        )
        if result.metadata.get("state"):
            print(f"stopped at step {result.steps} of {config.steps}: go on with --resume {result.metadata['state']}")
        checkpoint = result.final_checkpoint
        if not args.evaluate:
            return 0
    try:  # a checkpoint that is not a demo model's is refused while loading, before any sampling
        evaluation = evaluate_demo(
            checkpoint,
            seeds_per_class=args.eval_seeds,
            ode_steps=args.eval_ode_steps,
            ode_guidance=args.eval_ode_guidance,
            device=args.eval_device,
        )
    except SinkscopeError as error:  # the file's own problem (a WeightsError); anything else is a bug
        parser.error(f"argument --evaluate-only: {error}" if args.evaluate_only else str(error))
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "eval.json") as tmp:
        tmp.write_text(json.dumps(evaluation, indent=1))
    print(format_evaluation(evaluation))
    print()
    print(format_attention(evaluation))
    return 0


if __name__ == "__main__":
    sys.exit(main())
