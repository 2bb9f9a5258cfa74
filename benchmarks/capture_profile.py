"""Where a captured generation spends its time: torch.profiler over one generation with
every layer captured, beside one uncaptured, random bf16 weights at a real size.

- default: a 21-frame Self-Forcing generation at the Wan2.1-T2V-1.3B size, eager;
- ``--longlive2 FRAMES``: LongLive 2.0's procedure at the Wan2.2-TI2V-5B size (704x1280,
  chunks of 8, window 32 with an 8-frame sink, UniPC 4 steps and the clean pass), the
  blocks compiled as ``longlive2_speed.py`` compiles them.

Prints the top CUDA kernels and host operators of the captured generation, and, for the
kernels whose GPU time capture changes most, their time in both runs (``kernel_deltas``), so
docs/performance.md can say where the overhead goes.

    PYTHONPATH=src python benchmarks/capture_profile.py [--layers 30] [--fused] [--out $OUT]
    PYTHONPATH=src python benchmarks/capture_profile.py --longlive2 64 --fused --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_benchmark import random_context, random_real_model  # noqa: E402
from longlive2_speed import options_for, real_model  # noqa: E402

from sinkscope.generation.capture import FrameStatsCapture  # noqa: E402
from sinkscope.generation.sampler import generate  # noqa: E402
from sinkscope.options import GenerationOptions  # noqa: E402


def timed(model, context, options, layers, fused=False) -> float:
    torch.cuda.synchronize()
    began = time.perf_counter()
    if layers:
        frame_seq_length = model.config.frame_seq_length()
        with FrameStatsCapture(model, layers, frame_seq_length=frame_seq_length, fused_attention=fused) as capture:
            generate(model, context, options=options, seed=0, observers=[capture])
            capture.layer_tables()
    else:
        generate(model, context, options=options, seed=0)
    torch.cuda.synchronize()
    return time.perf_counter() - began


def profiled(run) -> torch.profiler.profile:
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        run()
    return profile


def kernel_totals(profile: torch.profiler.profile) -> dict[str, tuple[int, float]]:
    """GPU kernels by name: (launches, milliseconds)."""
    totals: dict[str, tuple[int, float]] = {}
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            count, ms = totals.get(event.name, (0, 0.0))
            totals[event.name] = (count + 1, ms + event.time_range.elapsed_us() / 1000)
    return totals


def kernel_deltas(plain: dict[str, tuple[int, float]], captured: dict[str, tuple[int, float]], rows: int) -> list[dict]:
    """The ``rows`` kernel names whose GPU time capture changes most (by size, added or saved)."""
    none = (0, 0.0)
    deltas = []
    for name in set(plain) | set(captured):
        (launches_plain, ms_plain), (launches_captured, ms_captured) = plain.get(name, none), captured.get(name, none)
        deltas.append(
            {
                "kernel": name[:120],
                "launches_plain": launches_plain,
                "launches_captured": launches_captured,
                "ms_plain": round(ms_plain, 2),
                "ms_captured": round(ms_captured, 2),
                "ms_added": round(ms_captured - ms_plain, 2),
            }
        )
    return sorted(deltas, key=lambda d: -abs(d["ms_added"]))[:rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=30, help="captured layers (0..N-1)")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--rows", type=int, default=15, help="rows of each table")
    parser.add_argument(
        "--fused",
        action="store_true",
        help="capture.attention: fused (attention_frame_partials_tma_kernel) instead of exact",
    )
    parser.add_argument(
        "--longlive2",
        type=int,
        default=0,
        metavar="FRAMES",
        help="LongLive 2.0's procedure at the Wan2.2-TI2V-5B size for FRAMES latent frames (compiled)",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.longlive2:
        model = real_model()
        model.compile_blocks(dynamic=False)
        context, options = random_context(), options_for(args.longlive2, 8, 32, 8)
        video_frames, name = 4 * args.longlive2 - 3, f"longlive2-{args.longlive2}-frames"
    else:
        model, context, options = random_real_model(), random_context(), GenerationOptions()
        video_frames, name = 81, "self-forcing-21-frames"
    layers = list(range(args.layers))
    for _ in range(2):  # warm-up: kernels compiled, allocator settled
        timed(model, context, options, layers, args.fused)
        timed(model, context, options, [])
    plain = sorted(timed(model, context, options, []) for _ in range(3))[1]
    captured = sorted(timed(model, context, options, layers, args.fused) for _ in range(3))[1]
    plain_profile = profiled(lambda: timed(model, context, options, []))
    profile = profiled(lambda: timed(model, context, options, layers, args.fused))
    kernels = profile.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows)
    host = profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows)
    plain_kernels, captured_kernels = kernel_totals(plain_profile), kernel_totals(profile)
    summary = {
        "run": name,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "layers": args.layers,
        "attention": "fused" if args.fused else "exact",
        "seconds_no_capture": plain,
        "seconds_captured": captured,
        "overhead_pct": 100 * (captured / plain - 1),
        "video_fps_captured": video_frames / captured,
        "video_fps_no_capture": video_frames / plain,
        "gpu_ms_no_capture": sum(ms for _, ms in plain_kernels.values()),
        "gpu_ms_captured": sum(ms for _, ms in captured_kernels.values()),
        "kernel_deltas": kernel_deltas(plain_kernels, captured_kernels, args.rows),
    }
    text = json.dumps(summary, indent=1) + "\n\nTop CUDA kernels:\n" + kernels + "\n\nTop host operators:\n" + host
    (out / f"profile-{name}-{args.layers}-layers{'-fused' if args.fused else ''}.txt").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
