"""What the demo learned: samples from the real KV-cache sampler against the data (motion
classifier, video features), the validation loss, and the attention summary."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sinkscope.demo import data as synthetic
from sinkscope.demo.objective import (
    class_contexts,
    empty_context,
    sampler_timesteps,
    teacher_forcing_forward,
)
from sinkscope.demo.ode import ode_generate
from sinkscope.generation.sampler import (
    generate,
    seeded_noise,
)
from sinkscope.model import (
    WanModel,
    build_model,
)
from sinkscope.model.text import demo_embedding
from sinkscope.options import GenerationOptions


@torch.no_grad()
def validation_loss(model: WanModel, *, batch_size: int = 8, seed: int = 1 << 61, data: dict | None = None) -> float:
    """The teacher-forcing flow-matching loss on a fixed batch (fixed videos, noise and
    block timesteps cycling through the sampler's): a noise-free measure of progress."""
    options = GenerationOptions()
    block_sizes = options.block_sizes()
    device = model.device
    batch = synthetic.synthetic_batch(seed, batch_size, **(data or {}))
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
        (weight * ((hh[:, None] - com_y[..., None, None]) ** 2 + (ww[None, :] - com_x[..., None, None]) ** 2)).sum(
            (2, 3)
        )
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


def _reference(
    videos_per_class: int, seed: int, options: dict
) -> tuple[dict, MotionClassifier, torch.Tensor, torch.Tensor]:
    classes = len(synthetic.CLASSES)
    labels = torch.arange(classes).repeat_interleave(videos_per_class)
    data = synthetic.synthetic_batch(seed, len(labels), classes=labels, **options).latents
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
    model: WanModel,
    *,
    seeds: Sequence[int],
    classes: Sequence[str] = synthetic.CLASSES,
    options: GenerationOptions | None = None,
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
                r
                for r in capture.records
                if r.layer == layer
                and r.call.block == last_block
                and r.call.pass_ == "denoise"
                and r.call.step == last_step
            ]
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
        summary["layers"].append(
            {
                "layer": layer,
                "frame0": float(mass[layer, :, :, 0].mean()),
                "frame0_max_head": float(mass[layer, :, :, 0].mean(1).max()),
                "own_block": float(own[layer].mean()),
                "lag6": float(lag6[layer].mean()),
                "heads_peak_on_frame0": float((top_outside[layer] == 0).float().mean()),
                "entropy_frames": float(entropy[layer]),
            }
        )
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
    ode_guidance: float = 1.0,
    data: dict | None = None,
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
    from the few-step sampler; ``ode_guidance`` != 1 guides it against the empty prompt
    (classifier-free guidance, as an ODE distillation pool is made). ``data``: the
    ``synthetic_batch`` options of the data to compare with; by default those the
    checkpoint records (``synthetic.options_of``), the current data for a model given
    in memory.
    """
    from sinkscope.model.loading import load_transformer

    began = time.perf_counter()
    if model is None:
        if checkpoint_path is None:
            raise ValueError("give checkpoint_path or model")
        model = load_transformer(checkpoint_path, format="self_forcing", model="demo", ema=ema, device=device)
    model = model.eval()
    if data is None:
        data = {}
        if checkpoint_path is not None:
            from sinkscope.model.weightfiles import resolve_path

            saved = torch.load(resolve_path(str(checkpoint_path)), map_location="cpu", weights_only=True).get(
                "sinkscope", {}
            )
            data = synthetic.options_of(saved.get("data"))
    reference, classifier, _, _ = _reference(reference_per_class, _EVAL_SEED, data)
    classes = len(synthetic.CLASSES)
    held_labels = torch.arange(classes).repeat_interleave(max(seeds_per_class, 20))
    held = synthetic.synthetic_batch(_EVAL_SEED + 1, len(held_labels), classes=held_labels, **data).latents
    seeds = [_EVAL_SEED % 1000 + i for i in range(seeds_per_class)]
    result: dict[str, Any] = {
        "checkpoint": str(checkpoint_path) if checkpoint_path is not None else None,
        "seeds": seeds,
        "chance": 1.0 / classes,
        "classes": dict(synthetic.CLASS_PROMPTS),
        "data_options": dict(data),
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
        ode = ode_generate(
            model, contexts, noise, steps=ode_steps, guidance=ode_guidance, null_context=empty_context(config)
        ).latents.cpu()
        result["trained_ode"] = _video_metrics(ode, labels, reference, classifier)
        result["ode_steps"] = ode_steps
        result["ode_guidance"] = ode_guidance
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
        (f"motion classifier accuracy (chance {result['chance']:.2f})", "classifier_accuracy", "{:.2f}"),
        ("std of all values", "std", "{:.3f}"),
        ("frame std, first block", "frame_std_first_block", "{:.3f}"),
        ("frame std, last block", "frame_std_last_block", "{:.3f}"),
        ("frame std curve, RMS error vs data", "frame_std_rms_error", "{:.3f}"),
        ("peak shape energy / data's", "peak_energy_ratio", "{:.2f}"),
        ("centre-of-mass speed (px/frame)", "speed", "{:.2f}"),
        ("trajectory error to nearest data video (px)", "trajectory_error", "{:.2f}"),
        ("identity: colour cosine, frame 0 vs 20", "identity", "{:.2f}"),
    ]
    guided = f", guidance {result['ode_guidance']:g}" if result.get("ode_guidance", 1.0) != 1.0 else ""
    names = {"trained_ode": f"trained, ODE {result.get('ode_steps')} steps/block{guided}"}
    lines = ["| metric | " + " | ".join(names.get(c, c) for c in columns) + " |", "| --- |" + " ---: |" * len(columns)]
    for label, key, fmt in rows:
        lines.append(f"| {label} | " + " | ".join(fmt.format(result[c][key]) for c in columns) + " |")
    for name in synthetic.CLASSES:
        lines.append(
            f"| accuracy, {name} | "
            + " | ".join(f"{result[c]['per_class'][name]['accuracy']:.2f}" for c in columns)
            + " |"
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
        "| layer | "
        + " | ".join(
            f"{c}: frame 0 | {c}: own block | {c}: lag 6 | {c}: heads peaking at frame 0 | {c}: entropy / uniform"
            for c in columns
        )
        + " |",
        "| --- |" + " ---: |" * (5 * len(columns)),
    ]
    for layer in range(len(first["layers"])):
        cells = []
        for c in columns:
            entry = result[c]["attention"]["layers"][layer]
            entropy = entry.get("entropy_frames")  # absent in evaluations made before it existed
            cells += [
                f"{entry['frame0']:.3f}",
                f"{entry['own_block']:.3f}",
                f"{entry['lag6']:.3f}",
                f"{entry['heads_peak_on_frame0']:.2f}",
                "n/a" if entropy is None else f"{entropy:.3f}",
            ]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
