"""Speed and memory of sinkscope's LongLive 2.0 generation at the real shape.

Wan2.2-TI2V-5B (30 layers, 24 heads, dim 3072, 48 latent channels) with random bf16
weights, 704x1280 video (44x80 latents, 880 tokens a latent frame), LongLive 2.0's
procedure (``procedure: longlive2``: chunks of 8, UniPC 4 steps, the clean pass, a 32-frame
cache with an 8-frame sink), the blocks compiled as an extraction job compiles them
(``WanModel.compile_blocks(dynamic=False)``, as ``benchmarks/gpu_benchmark.py``):

- uncaptured generation of each ``--frames`` length (default 64 and 128 latent frames):
  seconds, video FPS ((4 F - 3) / seconds: the Wan2.2 VAE's 4x temporal stride), ms a chunk,
  peak GPU memory;
- at the longest length, with 1 layer (layer 4) and all 30 layers captured
  (``FrameStatsCapture``, rows collected as ``gpu_benchmark`` does): the same, and the
  overhead against uncaptured.

``--captures`` picks rows (``none``, ``layer``, ``exact``, ``exact_written`` (the default route,
rows written as a job: on a Hopper GPU with flash-attn-4, its one pass), ``fused``, ``fused_written``: the
fused route with each call's rows handed to an extraction job's writer threads during the
generation, as a job runs; ``frames`` and ``frames_written``: ``capture.attention: frames``
with ``capture.statistics: [logit_mean, prob_mass]``, collected after or written as a job;
``exact_logit_written``: the exact route with ``capture.statistics: [logit_mean]``, written;
``exact_no_entropy_written``: the same with every statistic but entropy;
default all).
Medians over ``--reps`` generations after one warm-up. The text encoder and the VAE are not
run (as the fact sheet's measurement of LongLive's own pipeline). Writes ``results.json``
to ``--out`` (default $OUT or ./benchmark-out) after every row (a run cut off by a time limit
keeps the rows it finished) and prints it at the end.

``--quick``: a CPU smoke run of the same code on a tiny model of the 5B's kind (2 layers,
48 channels, 4x6 latents, chunks of 2), float32, no compile; it checks the script, not speed.

    PYTHONPATH=src python benchmarks/longlive2_speed.py --out $OUT
    PYTHONPATH=src python benchmarks/longlive2_speed.py --quick --out /tmp/ll2
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import captured_generation  # noqa: E402

from report import error_entry, write_results  # noqa: E402
from sinkscope.attention.settings import KernelSettings  # noqa: E402
from sinkscope.model import WanConfig, build_model, get_model_config, init_random_weights  # noqa: E402
from sinkscope.options import GenerationOptions  # noqa: E402

GiB = 2**30
STEPS = [999, 937, 833, 624]
# The rows: uncaptured (every --frames), then at the longest: 1 layer, all layers exact, all layers
# fused (rows collected after the generation), all layers fused with the rows written as a job
# writes them (handed to its writer threads during the generation).
CAPTURES = (
    "none",
    "layer",
    "exact",
    "exact_written",
    "fused",
    "fused_written",
    "frames",
    "frames_written",
    "exact_logit_written",
    "exact_no_entropy_written",
)
FRAMES_STATISTICS = ("logit_mean", "prob_mass")
ALL_STATISTICS = ("logit_mean", "prob_mass", "argmax_share", "entropy")
QUICK = WanConfig(
    dim=64,
    ffn_dim=96,
    num_heads=2,
    num_layers=2,
    in_dim=48,
    out_dim=48,
    text_dim=16,
    text_len=8,
    freq_dim=16,
    latent_height=4,
    latent_width=6,
)


def real_model() -> torch.nn.Module:
    with torch.device("cuda"):
        model = build_model(get_model_config("wan2.2-ti2v-5b"), seed=None, device="cuda", dtype=torch.float32)
    init_random_weights(model, seed=0, device="cuda")
    return model.to(torch.bfloat16)


def options_for(frames: int, chunk: int, window: int, sink: int) -> GenerationOptions:
    return GenerationOptions.from_config(
        {
            "procedure": "longlive2",
            "num_frames": frames,
            "frames_per_block": chunk,
            "local_attn_frames": window,
            "sink_frames": sink,
            "denoising_steps": STEPS,
        }
    )


def time_generation(
    model,
    context,
    options,
    layers,
    reps,
    frame_seq_length,
    attention="exact",
    written=False,
    token_profiles="last_block",
    chosen=ALL_STATISTICS,
) -> dict:
    """Median seconds of ``reps`` generations after one warm-up (generation plus collecting
    the rows when captured; ``written``: rows written as a job writes them,
    ``timing.captured_generation``), the parts, video FPS and the peak memory."""
    totals, generations, collects, peak, rows, writer = [], [], [], 0, None, []
    for rep in range(reps + 1):
        if context.is_cuda:
            torch.cuda.empty_cache()
        details: dict = {}
        result, collect, count = captured_generation(
            model,
            context,
            options,
            layers,
            frame_seq_length,
            attention=attention,
            written=written,
            statistics=chosen,
            token_profiles=token_profiles,
            details=details,
        )
        rows = count if layers else None
        if rep == 0:
            first = result.seconds
            continue
        totals.append(result.seconds + collect)
        generations.append(result.seconds)
        collects.append(collect)
        writer.append(details)
        peak = max(peak, result.peak_memory_bytes or 0)
        finite = bool(torch.isfinite(result.latents).all())
    median = statistics.median(totals)
    frames, chunks = options.num_frames, len(options.block_sizes())
    return {
        "latent_frames": frames,
        "seconds_median": median,
        "seconds_min": min(totals),
        "seconds_max": max(totals),
        "first_run_seconds": first,
        "generation_seconds_median": statistics.median(generations),
        "collect_seconds_median": statistics.median(collects),
        "video_fps": (4 * frames - 3) / median,
        "ms_per_chunk": 1000 * median / chunks,
        "peak_gib": peak / GiB,
        "kv_cache_gib": result.kv_cache_bytes / GiB,
        "rows": rows,
        "latents_finite": finite,
        **{f"{name}_median": statistics.median(d[name] for d in writer) for name in (writer[0] if written else ())},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--frames", default="64,128", help="latent frame counts, comma-separated")
    parser.add_argument("--reps", type=int, default=2, help="timed generations per variant (after one warm-up)")
    parser.add_argument("--no-compile", action="store_true", help="run the blocks eagerly")
    parser.add_argument(
        "--no-fused-norms", action="store_true", help="the block's norms, gates and RoPE as PyTorch ops"
    )
    parser.add_argument("--no-cuda-graphs", action="store_true", help="no CUDA graphs of the layers' work")
    parser.add_argument("--quick", action="store_true", help="CPU smoke run on a tiny model of the 5B's kind")
    parser.add_argument(
        "--captures",
        default=",".join(CAPTURES),
        help=f"which rows, comma-separated, of: {', '.join(CAPTURES)} (default: all)",
    )
    parser.add_argument(
        "--token-profiles",
        default="last_block",
        choices=("none", "last_block", "all"),
        help="which captured calls get key-token profiles (default: last_block, a job's default)",
    )
    args = parser.parse_args()
    captures = args.captures.split(",")
    if unknown := sorted(set(captures) - set(CAPTURES)):
        parser.error(f"--captures: unknown {', '.join(unknown)}; known: {', '.join(CAPTURES)}")

    frames = [int(f) for f in args.frames.split(",")]
    if args.quick:
        model = build_model(QUICK, seed=0)
        context = torch.randn(1, 5, QUICK.text_dim, generator=torch.Generator().manual_seed(1))
        chunk, window, sink = 2, 8, 2
        frames = [f // 4 for f in frames]  # 16 and 32 latent frames
        captured_layers = [0]
        device = "cpu"
    else:
        if not torch.cuda.is_available():
            parser.error("the real shape needs CUDA; --quick runs a CPU smoke test")
        model = real_model()
        context = torch.randn(1, 24, 4096, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
        chunk, window, sink = 8, 32, 8
        captured_layers = [4]
        device = torch.cuda.get_device_name()
    model.kernels = KernelSettings(fused_norms=not args.no_fused_norms, cuda_graphs=not args.no_cuda_graphs)
    config = model.config
    frame_seq_length = config.frame_seq_length()
    results: dict = {
        "device": device,
        "torch": torch.__version__,
        "model": config.to_dict(),
        "chunk": chunk,
        "window": window,
        "sink": sink,
        "steps": STEPS,
        "reps": args.reps,
        "token_profiles": args.token_profiles,
        "compiled": not (args.quick or args.no_compile),
        "kernels": dataclasses.asdict(model.kernels),
        "weights_gib": sum(p.numel() * p.element_size() for p in model.parameters()) / GiB,
    }
    if not args.quick and not args.no_compile:
        began = time.perf_counter()
        model.compile_blocks(dynamic=False)
        results["compile_setup_seconds"] = time.perf_counter() - began
    # label, frames, layers, capture.attention, written as a job, capture.statistics
    variants = [
        (f"{n} frames, no capture", n, [], "exact", False, ALL_STATISTICS) for n in frames if "none" in captures
    ]
    longest, every, all_layers = max(frames), list(range(config.num_layers)), f"all {config.num_layers} layers captured"
    rows = {
        "layer": (f"{longest} frames, 1 layer captured", longest, captured_layers, "exact", False, ALL_STATISTICS),
        "exact": (f"{longest} frames, {all_layers}", longest, every, "exact", False, ALL_STATISTICS),
        "exact_written": (
            f"{longest} frames, {all_layers}, rows written as a job",
            longest,
            every,
            "exact",
            True,
            ALL_STATISTICS,
        ),
        "fused": (f"{longest} frames, {all_layers}, fused", longest, every, "fused", False, ALL_STATISTICS),
        "fused_written": (
            f"{longest} frames, {all_layers}, fused, rows written as a job",
            longest,
            every,
            "fused",
            True,
            ALL_STATISTICS,
        ),
        "frames": (f"{longest} frames, {all_layers}, frames", longest, every, "frames", False, FRAMES_STATISTICS),
        "frames_written": (
            f"{longest} frames, {all_layers}, frames, rows written as a job",
            longest,
            every,
            "frames",
            True,
            FRAMES_STATISTICS,
        ),
        "exact_logit_written": (
            f"{longest} frames, {all_layers}, exact, logit_mean only, rows written as a job",
            longest,
            every,
            "exact",
            True,
            ("logit_mean",),
        ),
        "exact_no_entropy_written": (
            f"{longest} frames, {all_layers}, exact, every statistic but entropy, rows written as a job",
            longest,
            every,
            "exact",
            True,
            ("logit_mean", "prob_mass", "argmax_share"),
        ),
    }
    variants += [row for capture, row in rows.items() if capture in captures]
    for label, n, layers, attention, written, chosen in variants:
        try:
            results[label] = time_generation(
                model,
                context,
                options_for(n, chunk, window, sink),
                layers,
                args.reps,
                frame_seq_length,
                attention,
                written,
                args.token_profiles,
                chosen,
            )
        except Exception as error:  # noqa: BLE001 - report, keep going
            results[label] = error_entry(error)
        write_results(results, args.out, partial=True)
    base = results.get(f"{longest} frames, no capture", {}).get("seconds_median")
    for label, _n, layers, *_ in variants:
        row = results[label]
        if layers and base and "seconds_median" in row:
            row["overhead_pct"] = 100 * (row["seconds_median"] / base - 1)
    return write_results(results, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
