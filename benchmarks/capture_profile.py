"""Where a captured generation spends its time: torch.profiler over one 21-frame
generation at the Wan2.1-T2V-1.3B size (random bf16 weights), every layer captured.

Prints the top CUDA kernels and the top host-side operators, and the generation's wall
time with and without capture, so docs/performance.md can say where the overhead goes.

    PYTHONPATH=src python benchmarks/capture_profile.py [--layers 30] [--fused] [--out $OUT]
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

from sinkscope.generation.capture import FrameStatsCapture  # noqa: E402
from sinkscope.generation.sampler import generate  # noqa: E402
from sinkscope.options import GenerationOptions  # noqa: E402


def timed(model, context, options, layers, fused=False) -> float:
    torch.cuda.synchronize()
    began = time.perf_counter()
    if layers:
        with FrameStatsCapture(model, layers, frame_seq_length=1560, fused_attention=fused) as capture:
            generate(model, context, options=options, seed=0, observers=[capture])
            capture.layer_tables()
    else:
        generate(model, context, options=options, seed=0)
    torch.cuda.synchronize()
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=30, help="captured layers (0..N-1)")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmark-out"))
    parser.add_argument("--rows", type=int, default=15, help="rows of each table")
    parser.add_argument("--fused", action="store_true", help="capture.attention: fused (attention_frame_partials_tma_kernel) instead of exact")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, context, options = random_real_model(), random_context(), GenerationOptions()
    layers = list(range(args.layers))
    for _ in range(2):  # warm-up: kernels compiled, allocator settled
        timed(model, context, options, layers, args.fused)
    plain = sorted(timed(model, context, options, []) for _ in range(3))[1]
    captured = sorted(timed(model, context, options, layers, args.fused) for _ in range(3))[1]
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        timed(model, context, options, layers, args.fused)
    kernels = profile.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows)
    host = profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows)
    summary = {"layers": args.layers, "attention": "fused" if args.fused else "exact", "seconds_no_capture": plain, "seconds_captured": captured,
               "overhead_pct": 100 * (captured / plain - 1), "video_fps_captured": 81 / captured,
               "video_fps_no_capture": 81 / plain}  # fmt: skip
    text = json.dumps(summary, indent=1) + "\n\nTop CUDA kernels:\n" + kernels + "\n\nTop host operators:\n" + host
    (out / f"profile-{args.layers}-layers{'-fused' if args.fused else ''}.txt").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
