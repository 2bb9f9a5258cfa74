"""sinkscope's LongLive 2.0 procedure against LongLive 2.0's own pipeline, on a tiny model, on the CPU.

Their ``CausalDiffusionInferencePipeline`` (NVlabs/LongLive at commit 7860ad9, from
``--longlive-root``, imported with ``longlive2_theirs.py``'s shims) builds a tiny model of the
5B's kind (48 channels, 2 layers, dim 64, 2 heads, 4x6 latents) with its own seeded init, in
float32. Its generator's state dict is written as their ``model_bf16.pt`` layout (a
``generator`` entry) and loaded by ``sinkscope.model.load_transformer``; both pipelines then
generate from the same noise (sinkscope's seeded draw, handed to theirs) and the same text
context, with their ``configs/inference.yaml`` at chunks of 2, a window of 8 and a sink of 2.

Compared, per case: the latents, and every self-attention call of every layer in order: the
queries and keys the softmax sees (their ``attention(roped_query, roped_window_k, window_v)``
against what sinkscope's observer receives, which is what its statistics are computed from),
and the frame statistics row by row (each call's, computed by sinkscope's float64 reference
from their q and k and from ours, under the call's layout).
Cases: one prompt (16 frames: the window rolls, the global sink stays); two prompts, the
second starting with their scene-cut prefix (a shot sink pinned, the RoPE offset per shot);
the same with their relative RoPE. Their init zeroes the output head, so every weight gets a
seeded perturbation first (else every latent would stay its noise). Also checked: the scene
cut leaves the frames before it alone and changes the rest, and relative RoPE changes the
video (else the cases would not test those paths).

Float32 on both sides: their attention's bf16 casts (``attention()``'s fallback and the
``flash_attention`` shim) are replaced by the same SDPA call in float32, and their Triton RoPE
and adaLN kernels are off (CPU). Not compared: the NVFP4 cache (their quantizer is CUDA
code). Prints a JSON report and exits 1 if a case differs by more than ``--atol`` or a path
was not exercised.

    python3 -m pip install einops diffusers==0.31.0   # their imports
    python3 benchmarks/longlive2_parity.py --longlive-root third_party/LongLive
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
import longlive2_theirs as theirs  # noqa: E402

CHUNK, WINDOW, SINK, HEIGHT, WIDTH = 2, 8, 2, 4, 6


class Recorder:
    """Each self-attention call's (q, k) as [H, L, D] float64, in call order (per layer)."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def add(self, q: torch.Tensor, k: torch.Tensor) -> None:
        self.calls.append((q.detach().double().clone(), k.detach().double().clone()))


def their_pipeline(root: Path, context: torch.Tensor):
    """Their pipeline with a tiny seeded model in float32, and a recorder on its self-attention."""
    theirs.install_shims(root, cpu=True)
    theirs.patch_attention()
    from pipeline.causal_diffusion_inference import CausalDiffusionInferencePipeline
    from utils.config import wan_default_config
    from wan_5b.modules import attention as attention_module
    from wan_5b.modules import causal_model, model

    float32_flash = functools.partial(theirs.sdpa_flash_attention, dtype=torch.float32)
    for module in (attention_module, model, causal_model):
        module.flash_attention = float32_flash
    recorder = Recorder()

    def recorded_attention(q, k, v, *args, **kwargs):  # their [B, L, N, D]
        recorder.add(q[0].transpose(0, 1), k[0].transpose(0, 1))
        kwargs["dtype"] = torch.float32
        return attention_module.attention(q, k, v, *args, **kwargs)

    causal_model.attention = recorded_attention
    config = theirs.load_config(root, CHUNK, WINDOW, SINK, HEIGHT, WIDTH)
    quick = theirs.QUICK
    wan_default_config[config.model_kwargs.model_name].update(
        num_heads=quick["num_heads"],
        head_dim=quick["dim"] // quick["num_heads"],
        num_transformer_blocks=quick["num_layers"],
    )
    with theirs.random_weights(quick, "cpu", seed=0), contextlib.redirect_stdout(sys.stderr):
        pipe = CausalDiffusionInferencePipeline(
            config, device=torch.device("cpu"), text_encoder=theirs.FixedTextEncoder(context), vae=torch.nn.Module()
        )
    pipe.generator.to(dtype=torch.float32)
    pipe.generator.model.eval().requires_grad_(False)
    # Their init zeroes the output head (a zero velocity would leave every latent its noise):
    # every weight gets a seeded perturbation, so the video depends on every layer.
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for _, parameter in sorted(pipe.generator.model.named_parameters()):
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return pipe, recorder


def our_model(state: dict, folder: Path):
    """Their generator's weights through sinkscope's loader, as their model_bf16.pt lays them out."""
    from sinkscope.model import WanConfig, load_transformer

    path = folder / "model_bf16.pt"
    torch.save({"generator": {f"model.{k}": v for k, v in state.items()}}, path)
    quick = theirs.QUICK
    config = WanConfig(
        dim=quick["dim"],
        ffn_dim=quick["ffn_dim"],
        num_heads=quick["num_heads"],
        num_layers=quick["num_layers"],
        in_dim=48,
        out_dim=48,
        text_dim=quick["text_dim"],
        text_len=quick["text_len"],
        freq_dim=quick["freq_dim"],
        latent_height=HEIGHT,
        latent_width=WIDTH,
    )
    return load_transformer(path, model=config, ema=False, allow_pickle=True, dtype=torch.float32)


def run_case(
    pipe, recorder: Recorder, model, context: torch.Tensor, frames: int, prompts: list[str], relative_rope: bool = False
) -> tuple[dict, torch.Tensor]:
    """One generation by each pipeline: the report, and their latents [F, C, H, W]."""
    from sinkscope.generation.common import NoiseStream
    from sinkscope.generation.sampler import generate
    from sinkscope.options import GenerationOptions

    segments = [0] + [c * CHUNK for c in range(1, len(prompts)) if prompts[c] != prompts[c - 1]]
    generation = {
        "procedure": "longlive2",
        "num_frames": frames,
        "frames_per_block": CHUNK,
        "local_attn_frames": WINDOW,
        "sink_frames": SINK,
        "denoising_steps": [999, 937, 833, 624],
        "re_cache": False,
        "use_relative_rope": relative_rope,
    }
    options = GenerationOptions.from_config(generation)
    noise = NoiseStream(0, frames, (48, HEIGHT, WIDTH), 0).initial  # [F, C, H, W], sinkscope's draw for seed 0

    recorder.calls.clear()
    pipe.use_relative_rope = relative_rope  # their config's inference.use_relative_rope
    with torch.inference_mode(), contextlib.redirect_stdout(sys.stderr):
        their_latents = pipe.inference(noise=noise[None].clone(), text_prompts=[prompts], return_latents=True)
    their_calls = list(recorder.calls)

    ours: list[tuple[torch.Tensor, torch.Tensor]] = []
    layouts: list = []
    layers = len(model.blocks)
    per_layer: dict[int, list] = {layer: [] for layer in range(layers)}

    def observer(layer):
        def observe(q, k, v, layout, frame_bias=None):
            qk = tuple(x[0].transpose(0, 1).double().clone() for x in (q, k))  # [B, L, H, D] -> [H, L, D]
            per_layer[layer].append((qk, layout))
            return None

        return observe

    for layer in range(layers):
        model.set_observer(layer, observer(layer))
    schedule = context if len(segments) == 1 else [(s, context, prompts[s // CHUNK]) for s in segments]
    try:
        result = generate(model, schedule, options=options, seed=0)
    finally:
        for layer in range(layers):
            model.set_observer(layer, None)
    # Their calls come layer by layer within each model call: interleave ours the same way.
    for call in range(len(per_layer[0])):
        ours += [per_layer[layer][call][0] for layer in range(layers)]
        layouts += [per_layer[layer][call][1] for layer in range(layers)]

    latents_ours = result.latents[0].transpose(0, 1).double()  # [F, C, H, W]
    latents_theirs = their_latents[0].double()
    report = {
        "frames": frames,
        "prompts": prompts,
        "relative_rope": relative_rope,
        "calls": [len(their_calls), len(ours)],
        "latents_max_abs_diff": float((latents_ours - latents_theirs).abs().max()),
        "latents_max_abs": float(latents_theirs.abs().max()),
        "latents_moved_from_noise": float((latents_theirs - noise.double()).abs().max()),
    }
    if len(their_calls) == len(ours):
        shapes = [a[1].shape == b[1].shape and a[0].shape == b[0].shape for a, b in zip(their_calls, ours)]
        report["calls_same_shapes"] = all(shapes)
        if all(shapes):
            report["q_max_abs_diff"] = max(float((a[0] - b[0]).abs().max()) for a, b in zip(their_calls, ours))
            report["k_max_abs_diff"] = max(float((a[1] - b[1]).abs().max()) for a, b in zip(their_calls, ours))
            # The frame statistics, row by row: each call's computed from their q and k and from
            # ours, under the call's layout (their code gives no attention weights).
            report["frame_statistics_max_abs_diff"] = max(
                statistics_difference(a, b, layout, model.config.frame_seq_length())
                for a, b, layout in zip(their_calls, ours, layouts)
            )
        else:
            first = shapes.index(False)
            report["first_shape_difference"] = {
                "call": first,
                "theirs": [list(t.shape) for t in their_calls[first]],
                "ours": [list(t.shape) for t in ours[first]],
            }
    return report, latents_theirs


def statistics_difference(theirs_qk, ours_qk, layout, frame_seq_length: int) -> float:
    """The largest difference of any frame statistic (logit_mean, prob_mass, argmax_share,
    entropy) of one call between their q, k and ours (float64, sinkscope's reference)."""
    from sinkscope.stats.attention import attention_statistics

    stats = [
        attention_statistics(
            q,
            k,
            frame_seq_length=frame_seq_length,
            query_frames=layout.query_frames,
            key_frames=layout.key_frames,
            key_lengths=layout.key_lengths,
            backend="torch",
            key_position_shift=layout.key_position_shift,
        )
        for q, k in (theirs_qk, ours_qk)
    ]
    return max(
        float((getattr(stats[0], name) - getattr(stats[1], name)).abs().max())
        for name in ("logit_mean", "prob_mass", "argmax_share", "entropy")
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--longlive-root", default=str(theirs.ROOT / "third_party" / "LongLive"))
    parser.add_argument("--atol", type=float, default=1e-4, help="the largest difference accepted, latents, q and k")
    args = parser.parse_args()
    root = Path(args.longlive_root).resolve()
    if not (root / "pipeline" / "causal_diffusion_inference.py").exists():
        parser.error(f"{root} is not a LongLive checkout (clone {theirs.UPSTREAM})")
    context = torch.randn(
        1, theirs.QUICK["text_len"], theirs.QUICK["text_dim"], generator=torch.Generator().manual_seed(1)
    )
    pipe, recorder = their_pipeline(root, context)
    with tempfile.TemporaryDirectory() as folder:
        model = our_model(pipe.generator.model.state_dict(), Path(folder))
    from utils.dataset import DEFAULT_SCENE_CUT_PREFIX

    cut = ["a boat"] * 4 + [DEFAULT_SCENE_CUT_PREFIX + "a harbour"] * 4
    cases = {
        "one prompt, 16 frames": (16, ["a boat"] * 8, False),
        "a scene cut at frame 8, 16 frames": (16, cut, False),
        "a scene cut at frame 8, 16 frames, relative RoPE": (16, cut, True),
    }
    reports, ok, latents = {}, True, {}
    for name, (frames, prompts, relative) in cases.items():
        report, latents[name] = run_case(pipe, recorder, model, context, frames, prompts, relative)
        diffs = [
            report.get(key, float("inf"))
            for key in ("latents_max_abs_diff", "q_max_abs_diff", "k_max_abs_diff", "frame_statistics_max_abs_diff")
        ]
        report["within_atol"] = all(d <= args.atol for d in diffs)
        ok &= report["within_atol"]
        reports[name] = report
    # The scene cut changes the video from its chunk on (the same text embedding: only the shot sink and RoPE differ).
    one, cut = list(latents.values())[:2]
    reports["the scene cut's effect"] = {
        "before_frame_8": float((one[:8] - cut[:8]).abs().max()),
        "from_frame_8": float((one[8:] - cut[8:]).abs().max()),
    }
    ok &= reports["the scene cut's effect"]["before_frame_8"] == 0 < reports["the scene cut's effect"]["from_frame_8"]
    # Relative RoPE changes the video once the window has rolled (the keys re-roped to their slots).
    absolute, relative = list(latents.values())[1:]
    reports["relative RoPE's effect"] = {"max_abs_diff": float((absolute - relative).abs().max())}
    ok &= reports["relative RoPE's effect"]["max_abs_diff"] > 0
    print(json.dumps({"upstream_commit": theirs.upstream_commit(root), "atol": args.atol, "cases": reports}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
